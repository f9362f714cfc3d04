"""Export a PyTorch training graph for ampc, with the trainable set PyTorch has.

    from ampc_export import export_training_graph
    export_training_graph(WithLoss(model), (x, target), "model.onnx", dynamo=True,
                          input_names=["x", "target"])

The module's forward must return the scalar loss. Either of PyTorch's exporters (PyTorch >= 2.1;
dynamo needs onnxscript): dynamo=True is torch.onnx.export(..., dynamo=True, optimize=False),
the default exporter since PyTorch 2.9 (opset 18 and up); dynamo=False is the TorchScript
exporter at opset 17 in TrainingMode.TRAINING without constant folding. Both keep BatchNorm,
Dropout and the parameters as a training graph needs them.

The model file then carries the metadata key "ampc.trainable": a JSON list of the ONNX
initializer names that are the module's named_parameters() with requires_grad. Registered
buffers (masks, position ids, running statistics) and frozen parameters are not listed, so
ampc trains exactly what PyTorch trains. A parameter whose initializer the exporter renamed
(tied weights, deduplicated constants) is found by its value.

And, where the module has an nn.Embedding with a padding_idx (BERT's and RoBERTa's word
embeddings, RoBERTa's positions), the key "ampc.embedding_padding": a JSON object of initializer
name -> padding row. Neither exporter keeps padding_idx (the lookup is a plain Gather), and
PyTorch gives that row no gradient from the lookup: ampc does the same with the key.

And, where the forward calls torch.autograd.Function subclasses of its own (outside torch): their
backward is code no exporter keeps, and ampc would differentiate the forward they export, which
differs from PyTorch's gradient where that backward is not the derivative (a straight-through
estimator, a spiking network's surrogate gradient, transformers' YOSO). A Function whose backward
is dy times a tensor, elementwise, on one input (checked on each call: elementwise_functions) is
written as stop(y) + (x - stop(x)) * stop(h), y and h its own forward's and backward's results,
traced: PyTorch's value and gradient. The others go into the key "ampc.custom_autograd", a JSON
list of their qualified names; ampc prints a note naming them, and the helper warns on stderr.

And, where the module holds BatchNorm modules left in eval() after module.train() (frozen, as
fine-tuning keeps them), the key "ampc.frozen_batchnorms": a JSON list of the results of their
BatchNormalization nodes. The dynamo exporter writes a train()-mode BatchNorm and a frozen one
alike (inference form), so without the key ampc trains both with batch statistics.

And, where the forward stops a gradient, an ampc.StopGradient node (domain "ampc"): neither
exporter keeps detach() (both write the value alone), so ampc would differentiate straight
through a straight-through estimator (VQ-VAE's z + (zq - z).detach()), a stop-gradient branch
(SimSiam, BYOL) or a target network, and train to a wrong loss with no error. During the export
the forward runs under StopGradientMode, which writes the marker for every detach() (Tensor.detach,
torch.detach, .data) and for every float result computed while gradients are off (torch.no_grad())
from a value that has one (spectral norm's power iteration), but not inside a torch.autograd.Function's
forward, which autograd runs with gradients off too (its backward gives the gradient). ampc gives the marker its operand's
value and no gradient (compiler/ops/grad.h kStopGradientOp). The same mode writes out
F.cross_entropy(..., label_smoothing=e) (_cross_entropy_smoothed): the dynamo exporter drops the
smoothing; and F.embedding(..., scale_grad_by_freq=True) as e_sg + (e - e_sg) / count (the lookup's
value, PyTorch's gradient: each row's divided by how often the batch looks it up), a flag both
exporters drop. Where the dynamo exporter fails with
the markers, the model is exported without them, and the key "ampc.unmarked_stop_gradients" holds
how many there would have been: ampc names it in a note.

Where the dynamo exporter fails (torch.export refuses Python control flow on a tensor's value, as
transformers' layerdrop and fake quantization's observer switch are written, or has no ONNX function
for an op), the TorchScript exporter writes the file instead, and the key "ampc.export_fallback"
says so and why (AMPC_EXPORT_FALLBACK=0 keeps the error).

A transformers (5 and later) mixture of experts runs its experts by a backend whose default
(grouped_mm, a custom op) no exporter writes: the helper exports it, and runs the checks above, with
the batched_mm backend (the same products in static shapes), and gives the model its backend back
after (_ExportableExperts).
"""
import functools
import json
import os
import sys

import torch

TRAINABLE_KEY = "ampc.trainable"
PADDING_KEY = "ampc.embedding_padding"
CUSTOM_KEY = "ampc.custom_autograd"
FROZEN_BN_KEY = "ampc.frozen_batchnorms"
UNMARKED_KEY = "ampc.unmarked_stop_gradients"
EXPORT_FALLBACK_KEY = "ampc.export_fallback"


def unused_parameters(module, args):
    """Names of the trainable parameters that one forward of `module` on `args` does not reach
    (PyTorch leaves their .grad None, and its optimizers skip them)."""
    import copy
    m = copy.deepcopy(module)
    out = m(*args)
    flat = out if isinstance(out, (tuple, list)) else [out]
    total = sum(t.float().sum() for t in flat if torch.is_tensor(t) and t.requires_grad)
    if torch.is_tensor(total):
        total.backward()
    return {n for n, p in m.named_parameters() if p.requires_grad and p.grad is None}


def custom_autograd_functions(module, args):
    """Qualified names of the torch.autograd.Function subclasses outside torch that one forward of
    `module` on `args` applies, in the order first applied. Function.apply is wrapped for that
    forward (on a copy, without gradients) and put back; where that cannot be done, none are named."""
    import copy
    F = torch.autograd.Function
    owner = next((k for k in F.__mro__ if "apply" in k.__dict__), None)
    original = owner.__dict__["apply"] if owner else None
    if not hasattr(original, "__get__"):  # a classmethod (PyTorch 2), or _FunctionBase's C one (1.x)
        return []
    seen = []

    def apply(cls, *a, **k):
        name = f"{cls.__module__}.{cls.__qualname__}"
        if not (cls.__module__ == "torch" or cls.__module__.startswith("torch.")) and name not in seen:
            seen.append(name)
        return original.__get__(None, cls)(*a, **k)
    F.apply = classmethod(apply)
    try:
        with torch.no_grad():
            copy.deepcopy(module)(*args)
    except Exception as e:  # noqa: BLE001 (a forward that needs gradients, a module deepcopy refuses: the export goes on)
        print(f"ampc_export: could not look for custom autograd Functions ({type(e).__name__}: {e}); none are named",
              file=sys.stderr)
        return []
    finally:
        if owner is F:
            F.apply = original
        else:
            del F.apply
    return seen


class _Ctx:
    """A stand-in for autograd's ctx: what a Function's forward stores for its backward."""

    def __init__(self, n):
        self.needs_input_grad = (True,) * n
        self.saved_tensors = ()

    def save_for_backward(self, *t):
        self.saved_tensors = t

    def mark_non_differentiable(self, *t):
        pass

    def mark_dirty(self, *t):
        pass

    def set_materialize_grads(self, v):
        pass


def _forward_backward(cls, args, i):
    """cls's forward on args through a stand-in ctx, and its backward's gradient for input i at
    dy = 1 (traced as ordinary ops where an export runs this)."""
    ctx = _Ctx(len(args))
    base = getattr(torch.autograd.Function, "setup_context", None)
    if getattr(cls, "setup_context", base) is not base:  # PyTorch 2's form: forward without ctx, setup_context(ctx, inputs, output)
        y = cls.forward(*args)
        cls.setup_context(ctx, tuple(args), y)
    else:
        y = cls.forward(ctx, *args)
    g = cls.backward(ctx, torch.ones_like(y))
    g = g[i] if isinstance(g, (tuple, list)) else g
    return y, g


def elementwise_functions(module, args):
    """The torch.autograd.Function subclasses outside torch (class -> the input it differentiates)
    whose every call in one forward of `module` on `args` takes one float tensor that needs a
    gradient and returns one of its shape, with a backward that is dy times a tensor of the inputs
    (h), elementwise: a straight-through estimator (h = 1), a spiking network's surrogate gradient, a
    custom GELU. The export writes such a call as stop(y) + (x - stop(x)) * stop(h), with y and h
    from the Function's own forward and backward (traced through a stand-in ctx): the value y
    exactly, the gradient dy * h, as PyTorch's. Checked on each call against autograd's own
    gradient for two random dy (linear and elementwise in dy) and against the stand-in's y and h."""
    import copy
    F = torch.autograd.Function
    owner = next((k for k in F.__mro__ if "apply" in k.__dict__), None)
    original = owner.__dict__["apply"] if owner else None
    if not hasattr(original, "__get__"):
        return {}
    verdict = {}

    def check(cls, a, k, out):
        if k:
            return None
        idx = [j for j, t in enumerate(a) if torch.is_tensor(t) and t.is_floating_point() and t.requires_grad]
        if len(idx) != 1 or not torch.is_tensor(out) or not out.is_floating_point() or out.shape != a[idx[0]].shape:
            return None
        i = idx[0]
        x = a[i].detach().requires_grad_()
        xs = list(a)
        xs[i] = x
        with torch.enable_grad():
            y = original.__get__(None, cls)(*xs)
            if not y.requires_grad:
                return None
            dy1, dy2 = torch.randn_like(y), torch.randn_like(y)
            g1, = torch.autograd.grad(y, x, dy1, retain_graph=True)
            g2, = torch.autograd.grad(y, x, dy2)
        if g1 is None or g1.shape != x.shape:
            return None
        tol = 1e-5 * float(max(g1.abs().max(), g2.abs().max(), 1e-30))
        if not torch.allclose(g1 * dy2, g2 * dy1, rtol=1e-4, atol=tol):
            return None
        with torch.no_grad():
            ys, h = _forward_backward(cls, [t.detach() if torch.is_tensor(t) else t for t in xs], i)
        if not torch.is_tensor(h) or h.shape != x.shape or not torch.equal(ys, y.detach()) or not torch.allclose(h * dy1, g1, rtol=1e-4, atol=tol):
            return None
        return i

    def apply(cls, *a, **k):
        out = original.__get__(None, cls)(*a, **k)
        if not (cls.__module__ == "torch" or cls.__module__.startswith("torch.")) and cls is not _StopGradient:
            i = check(cls, a, k, out)
            if cls not in verdict:
                verdict[cls] = i
            elif verdict[cls] != i:
                verdict[cls] = None
        return out
    F.apply = classmethod(apply)
    try:
        with torch.enable_grad():
            copy.deepcopy(module)(*args)
    except Exception as e:  # noqa: BLE001 (the export goes on, the Functions as they are)
        print(f"ampc_export: could not check custom autograd Functions' backward ({type(e).__name__}: {e})", file=sys.stderr)
        return {}
    finally:
        if owner is F:
            F.apply = original
        else:
            del F.apply
    return {c: i for c, i in verdict.items() if i is not None}


STOP_GRADIENT = "ampc::StopGradient"


class _StopGradient(torch.autograd.Function):
    """The TorchScript exporter's marker: the traced forward is detach()'s, the ONNX node ours."""

    @staticmethod
    def forward(ctx, x):
        y = x.detach().clone()
        ctx.mark_non_differentiable(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        return None

    @staticmethod
    def symbolic(g, x):
        return g.op(STOP_GRADIENT, x)


def _stop_gradient(x, dynamo):
    if dynamo:  # torch.export traces no autograd.Function's symbolic: an ONNX node written as such
        return torch.onnx.ops.symbolic(STOP_GRADIENT, [x.detach()], dtype=x.dtype, shape=x.shape, version=1)
    return _StopGradient.apply(x)


def _stop_gradient_mode(dynamo, count_only=False):
    """A TorchFunctionMode that marks each detached value (see the module's docstring), or with
    count_only counts the values it would mark and leaves them as they are."""
    from torch.overrides import TorchFunctionMode

    detaching = {torch.Tensor.detach, torch.detach, torch.Tensor.data.__get__}

    def float_tensor(t):
        return isinstance(t, torch.Tensor) and t.is_floating_point()

    class StopGradientMode(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.marked = 0
            self.rewritten = 0
            self.forwards = None  # the code of every torch.autograd.Function's forward, found when first needed

        def in_function_forward(self):
            """Whether a torch.autograd.Function's forward is on the stack: autograd runs it with
            gradients off (Bloom's GeLUFunction, torch.utils.checkpoint's reentrant form), and its
            results get their gradient from the Function's backward, so nothing in it is a stop."""
            if self.forwards is None:
                self.forwards, todo = set(), [torch.autograd.Function]
                while todo:
                    c = todo.pop()
                    todo.extend(c.__subclasses__())
                    f = c.__dict__.get("forward")
                    code = getattr(getattr(f, "__func__", f), "__code__", None)
                    if code is not None and c is not _StopGradient:
                        self.forwards.add(code)
            f = sys._getframe(1)
            while f is not None:
                if f.f_code in self.forwards:
                    return True
                f = f.f_back
            return False

        def mark(self, t):
            self.marked += 1
            return t.detach() if count_only else _stop_gradient(t, dynamo)

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in detaching and args and float_tensor(args[0]):
                return args[0].detach() if self.in_function_forward() else self.mark(args[0])
            if func is torch.nn.functional.cross_entropy:
                smoothing = kwargs.get("label_smoothing", args[7] if len(args) > 7 else 0.0)
                if smoothing:
                    self.rewritten += 1
                    if not count_only:
                        return _cross_entropy_smoothed(*args, **kwargs)
            if func is torch.nn.functional.embedding and kwargs.get("max_norm", args[3] if len(args) > 3 else None) is not None:
                # max_norm: PyTorch renormalises the looked-up rows of the weight in place, under
                # no_grad (embedding_renorm_), then looks them up: the value is the renormed rows, the
                # gradient the plain lookup's. The dynamo exporter writes the renorm as ordinary ops
                # (a gradient through the scale), the TorchScript exporter drops it. Written out: the
                # rows, each scaled by max_norm / (norm + 1e-7) where its norm is over max_norm, as
                # stop(r) + (e - stop(e)). (The in-place write-back into the weight is not kept: ampc
                # renormalises the rows at each lookup instead.)
                self.rewritten += 1
                self.marked += 1
                if not count_only:
                    a = dict(zip(("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse"), args))
                    a.update(kwargs)
                    max_norm, p = a["max_norm"], a.get("norm_type", 2.0) or 2.0
                    a["max_norm"] = None
                    e = func(**a)
                    norms = e.norm(p=p, dim=-1, keepdim=True)
                    r = e * torch.where(norms > max_norm, max_norm / (norms + 1e-7), torch.ones_like(norms))
                    return _stop_gradient(r, dynamo) + (e - _stop_gradient(e, dynamo))
            if func is torch.nn.functional.embedding and kwargs.get("scale_grad_by_freq", args[5] if len(args) > 5 else False):
                # Both exporters write the lookup as a Gather and drop the flag (its effect is the
                # backward's alone: each row's gradient divided by how often the batch looks it up);
                # the dynamo exporter silently. Written out: e_sg + (e - e_sg) / count, the value e
                # exactly, the gradient dy / count (the marker on e_sg).
                self.rewritten += 1
                self.marked += 1
                if not count_only:
                    a = dict(zip(("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse"), args))
                    a.update(kwargs)
                    a["scale_grad_by_freq"] = False
                    e = func(**a)
                    idx, w = a["input"], a["weight"]
                    flat = idx.reshape(-1)
                    counts = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device).scatter_add(0, flat, torch.ones_like(flat, dtype=w.dtype))
                    sg = _stop_gradient(e, dynamo)
                    return sg + (e - sg) / counts[idx].unsqueeze(-1)
            out = func(*args, **kwargs)
            if torch.is_grad_enabled():
                return out
            flat = list(args) + list(kwargs.values())
            flat += [t for a in flat if isinstance(a, (list, tuple)) for t in a]
            if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in flat) or self.in_function_forward():
                return out
            if float_tensor(out) and not getattr(func, "__name__", "").endswith("_"):  # an in-place op's result is its operand
                return self.mark(out)
            if isinstance(out, tuple) and any(float_tensor(t) for t in out):
                return type(out)(self.mark(t) if float_tensor(t) else t for t in out) if type(out) is tuple else out
            return out

    return StopGradientMode()


def _cross_entropy_smoothed(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                            label_smoothing=0.0):
    """F.cross_entropy with label_smoothing written out as PyTorch defines it (ATen's
    cross_entropy_loss_label_smoothing): (1 - e) nll + e / C times the smoothing term, -sum over the
    classes of (weighted) log-probabilities, 0 at ignored targets, averaged over the targets' weights
    (or the targets not ignored); class probabilities are mixed with the uniform ones instead. The
    dynamo exporter writes cross_entropy(label_smoothing=e) as SoftmaxCrossEntropyLoss without it (an
    ONNX op with no smoothing: the plain loss, silently), the TorchScript exporter refuses it."""
    import torch.nn.functional as F
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    cdim = 1 if input.dim() >= 2 else 0
    classes = input.shape[cdim]
    e = label_smoothing
    if target.is_floating_point():
        return F.cross_entropy(input, target * (1 - e) + e / classes, weight, ignore_index=ignore_index, reduction=reduction)
    logp = F.log_softmax(input, cdim)
    nll = F.nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    if weight is not None:
        shape = [1] * logp.dim()
        shape[cdim] = classes
        smooth = -(logp * weight.view(shape)).sum(cdim)
    else:
        smooth = -logp.sum(cdim)
    ignored = target == ignore_index
    smooth = smooth.masked_fill(ignored, 0.0)
    if reduction == "mean":
        if weight is not None:
            smooth = smooth.sum() / weight.gather(0, target.masked_fill(ignored, 0).flatten()).view_as(target).masked_fill(ignored, 0.0).sum()
        else:
            smooth = smooth.sum() / (~ignored).sum()
    elif reduction == "sum":
        smooth = smooth.sum()
    return (1 - e) * nll + smooth * (e / classes)


def stop_gradients(module, args):
    """How many values one forward of `module` on `args` detaches, and how many cross_entropy calls
    with label_smoothing it makes (a copy, gradients on)."""
    import copy
    mode = _stop_gradient_mode(False, count_only=True)
    try:
        m = copy.deepcopy(module)
        with torch.enable_grad(), mode:
            m(*args)
    except Exception as e:  # noqa: BLE001 (a module deepcopy refuses, a forward that fails under the mode)
        print(f"ampc_export: could not look for detach() and label smoothing ({type(e).__name__}: {e}); the export writes "
              "neither marker nor rewrite, and ampc's gradients flow wherever the graph lets them", file=sys.stderr)
        return 0, 0
    return mode.marked, mode.rewritten


class _MarkedForward:
    """module.forward run under a StopGradientMode for the export, put back after; nothing where
    `marks` is 0 (a forward that detaches nothing is exported as it is)."""

    def __init__(self, module, dynamo, marks, functions=None):
        self.module, self.dynamo, self.marks, self.marked = module, dynamo, marks, 0
        self.functions = functions or {}

    def __enter__(self):
        if not self.marks:
            return self
        dynamo = self.dynamo
        self.installed = [(cls, cls.__dict__.get("apply")) for cls in self.functions]  # a class's own apply, put back after
        for cls, i in self.functions.items():  # see elementwise_functions
            def apply(c, *a, _i=i):
                y, h = _forward_backward(c, list(a), _i)
                x = a[_i]
                return _stop_gradient(y, dynamo) + (x - _stop_gradient(x, dynamo)) * _stop_gradient(h, dynamo)
            cls.apply = classmethod(apply)
        module, original = self.module, self.module.forward
        self.mode = _stop_gradient_mode(self.dynamo)
        mode = self.mode

        @functools.wraps(original)
        def forward(*a, **k):
            # Gradients on, as in training (an export called under torch.no_grad() would otherwise
            # mark every result): only the forward's own no_grad() regions turn them off.
            with torch.enable_grad(), mode:
                return original(*a, **k)

        self.own = module.__dict__.get("forward")  # an instance's own forward, if it had one
        module.forward = forward
        return self

    def __exit__(self, *exc):
        for cls, own in getattr(self, "installed", ()):
            if own is None:
                del cls.apply
            else:
                cls.apply = own
        self.installed = []
        if self.marks:
            if self.own is not None:
                self.module.forward = self.own
            else:
                del self.module.forward  # the instance attribute: the class's forward again
            self.marked = self.mode.marked


def frozen_batchnorms(module, proto):
    """The results of the BatchNormalization nodes (in `proto`) of `module`'s BatchNorm modules that
    are in eval() with running statistics: found by their running_mean initializer's name."""
    stats = {(prefix + "." if prefix else "") + "running_mean" for prefix, sub in module.named_modules()
             if isinstance(sub, torch.nn.modules.batchnorm._BatchNorm) and not sub.training and sub.track_running_stats}
    return [n.output[0] for n in proto.graph.node
            if n.op_type == "BatchNormalization" and len(n.input) > 3 and n.input[3] in stats and n.output]


def trainable_initializers(module, proto, model_dir=".", unused=lambda: set()):
    """(parameter name, ONNX initializer name) of `module`'s trainable parameters, in
    named_parameters() order; a parameter the forward never reads (unused() names it) has none
    where the exporter dropped it, and is left out."""
    import numpy as np
    from onnx import numpy_helper
    inits = {t.name: t for t in proto.graph.initializer}
    pairs, unmatched = {}, []
    for pname, p in module.named_parameters():
        if not p.requires_grad:
            continue
        if pname in inits:
            pairs[pname] = pname
        else:
            unmatched.append((pname, p))
    if unmatched:
        taken = set(pairs.values())
        for pname, p in unmatched:
            want = p.detach().cpu().float().numpy()
            hit = None
            for iname, t in inits.items():
                if iname in taken or tuple(t.dims) != tuple(want.shape):
                    continue
                arr = numpy_helper.to_array(t, base_dir=model_dir) if t.data_location == 1 else numpy_helper.to_array(t)
                if arr.dtype.kind == "f" and np.array_equal(arr.astype(np.float32), want):
                    hit = iname
                    break
            if hit is None:
                if pname not in unused():
                    raise RuntimeError(f"ampc_export: parameter {pname!r} has no initializer in the exported graph")
                # the forward never reads it (ESM's contact head): PyTorch gives it no gradient either
                print(f"ampc_export: parameter {pname!r} is not in the exported graph (the forward does not use it): "
                      "it is not trained", file=sys.stderr)
                continue
            pairs[pname] = hit
            taken.add(hit)
    return [(pname, pairs[pname]) for pname, p in module.named_parameters() if p.requires_grad and pname in pairs]


def _root_cause(e):
    while e.__cause__ is not None or (e.__context__ is not None and not e.__suppress_context__):
        e = e.__cause__ or e.__context__
    return e


class _ExportableExperts:
    """transformers (5 and later) runs a mixture of experts' expert products through an experts
    backend (model.set_experts_implementation): grouped_mm by default, a custom op
    (transformers::grouped_mm_fallback off CUDA bf16) that no exporter writes; eager, a loop over the
    experts this batch routes to (a data-dependent count: torch.export refuses it, and a trace would
    record this batch's experts only). batched_mm gathers each token's experts' weights and projects
    with one batched product: the same products in static shapes, which both exporters write. So the
    export runs with batched_mm, and each model gets its backends back after. The graph then holds
    the gathered weights (tokens x top-k copies of an expert's matrices)."""

    def __init__(self, module):
        self.saved = []
        if not any(type(m).__name__.endswith("Experts") for m in module.modules()):
            return
        for m in module.modules():
            get, put = getattr(m, "get_experts_implementation", None), getattr(m, "set_experts_implementation", None)
            if not callable(get) or not callable(put):
                continue
            try:
                now = get()
            except Exception:  # noqa: BLE001 (a model without experts may refuse the question)
                continue
            values = list(now.values()) if isinstance(now, dict) else [now]
            if any(v not in (None, "batched_mm") for v in values):
                self.saved.append((m, now))

    def __enter__(self):
        for m, _ in self.saved:
            m.set_experts_implementation("batched_mm")
        if self.saved:
            was = sorted({str(v) for _, now in self.saved for v in (now.values() if isinstance(now, dict) else [now])} - {"batched_mm"})
            print(f"ampc_export: the mixture of experts is exported with transformers' batched_mm experts backend (it ran with "
                  f"{', '.join(was)}, which no exporter writes in static shapes): the same products", file=sys.stderr)
        return self

    def __exit__(self, *exc):
        for m, now in reversed(self.saved):
            try:
                m.set_experts_implementation(now)
            except Exception:  # noqa: BLE001 (a version that takes only a name)
                m.set_experts_implementation(now.get("", "grouped_mm") if isinstance(now, dict) else now)
        return False


def _export_torchscript(module, args, path, marks, detached, opset, input_names, output_names):
    import inspect
    # PyTorch before 2.5 has no `dynamo` argument: the TorchScript exporter is its only one.
    kw = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
    with marks:
        torch.onnx.export(module, args, path, opset_version=opset or 17,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          input_names=input_names, output_names=list(output_names),
                          **({"custom_opsets": {"ampc": 1}} if detached else {}), **kw)


def export_training_graph(module, args, path, *, dynamo=True, input_names=None, output_names=("loss",),
                          opset=None, external_data=None):
    module.train()
    # A copy of the state dict with its _metadata (module versions: torchvision's MNASNet refuses a
    # load without its own).
    sd = module.state_dict()
    state = type(sd)((k, v.detach().clone()) for k, v in sd.items())
    if hasattr(sd, "_metadata"):
        state._metadata = sd._metadata
    args = tuple(args)
    # The analyses below run the forward the export writes: a mixture of experts on its exportable
    # backend (_ExportableExperts) throughout, the model's own restored after.
    with _ExportableExperts(module):
        # AMPC_EXPORT_MARKS=0 exports without the markers (to tell an exporter's failure from theirs).
        detached, smoothed = stop_gradients(module, args) if os.environ.get("AMPC_EXPORT_MARKS", "1") != "0" else (0, 0)
        fallback = None
        functions = elementwise_functions(module, args) if os.environ.get("AMPC_EXPORT_MARKS", "1") != "0" else {}
        if (detached or functions) and dynamo and not hasattr(getattr(torch.onnx, "ops", None), "symbolic"):
            if os.environ.get("AMPC_EXPORT_FALLBACK", "1") == "0":
                raise RuntimeError(f"ampc_export: the forward detaches {detached} value(s) (detach(), torch.no_grad()), and this PyTorch "
                                   f"({torch.__version__}) has no torch.onnx.ops.symbolic to mark them in the dynamo exporter's graph: "
                                   "export with dynamo=False, or PyTorch 2.9 or later")
            fallback = f"this PyTorch ({torch.__version__}) has no torch.onnx.ops.symbolic to mark the {detached} stop-gradient(s)"
            print(f"ampc_export: {fallback} in the dynamo exporter's graph; exported with the TorchScript exporter (dynamo=False)",
                  file=sys.stderr)
            dynamo = False
        marks = _MarkedForward(module, dynamo, detached + smoothed + len(functions), functions)
        fallback, unmarked, marks = _export(module, args, path, dynamo, marks, state, detached, smoothed, functions, fallback,
                                            opset, external_data, input_names, output_names)
        return _finish(module, args, path, state, marks, detached, smoothed, unmarked, fallback, functions)


def _export(module, args, path, dynamo, marks, state, detached, smoothed, functions, fallback, opset, external_data, input_names,
            output_names):
    """The export itself, by the dynamo exporter (the TorchScript one where it fails) or the
    TorchScript exporter: (the fallback's reason or None, the stop-gradients left unmarked, the
    markers the export ran with)."""
    unmarked = 0
    if dynamo:
        kw = dict(dynamo=True, optimize=False, input_names=input_names, output_names=list(output_names))
        if opset:
            kw["opset_version"] = opset
        if external_data is not None:
            kw["external_data"] = external_data
        try:
            try:
                with marks:
                    torch.onnx.export(module, args, path, **kw)
            except Exception as e:  # noqa: BLE001
                if not detached or smoothed:  # without the mode, label smoothing would be lost: the error stands
                    raise
                # The export fails with the markers: once more without them, as before they were
                # written, and the count goes into the file, where ampc names it in a note.
                print(f"ampc_export: the dynamo export with {detached} stop-gradient marker(s) failed ({type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200] if str(e) else ''}); exported without them: ampc's gradients may flow "
                      "where PyTorch's stop", file=sys.stderr)
                unmarked, marks = detached, _MarkedForward(module, dynamo, 0)
                module.load_state_dict(state)
                torch.onnx.export(module, args, path, **kw)
        except Exception as e:  # noqa: BLE001
            # torch.export refuses what the TorchScript exporter traces: Python control flow on a
            # tensor's value (transformers' layerdrop `if torch.rand([]) < p`, fake quantization's
            # `if self.observer_enabled[0] == 1`, gaussian_nll_loss's check of var), or an op it has no
            # ONNX function for (adaptive_max_pool2d, cdist). The TorchScript exporter runs the
            # forward once and records what ran: the same training graph, opset 17. The file says so
            # (EXPORT_FALLBACK_KEY), and so does stderr. AMPC_EXPORT_FALLBACK=0: the error stands.
            if os.environ.get("AMPC_EXPORT_FALLBACK", "1") == "0":
                raise
            cause = _root_cause(e)
            fallback = f"{type(cause).__name__}: {(str(cause).splitlines() or [''])[0][:300]}"
            print(f"ampc_export: the dynamo exporter failed ({fallback}); exported with the TorchScript exporter "
                  "(dynamo=False) instead, which records the branches this batch took (a TracerWarning names each)", file=sys.stderr)
            module.load_state_dict(state)
            unmarked, marks = 0, _MarkedForward(module, False, detached + smoothed + len(functions), functions)
            _export_torchscript(module, args, path, marks, detached + len(functions), opset if opset and opset <= 17 else None,
                                input_names, output_names)
    else:
        _export_torchscript(module, args, path, marks, detached + len(functions), opset, input_names, output_names)
    return fallback, unmarked, marks


def _finish(module, args, path, state, marks, detached, smoothed, unmarked, fallback, functions):
    """After the export: the running statistics put back, the notes, and ampc's metadata keys."""
    import onnx
    # Tracing ran the forward in training mode: put the running statistics back.
    module.load_state_dict(state)
    if smoothed:
        print(f"ampc_export: {smoothed} call(s) written out as PyTorch defines them (cross_entropy's label_smoothing: "
              "log_softmax, nll_loss and the smoothing term; embedding's scale_grad_by_freq: the gradient divided by each "
              "row's count; embedding's max_norm: the renormalised rows with the plain lookup's gradient, renormalised at "
              "each lookup, not written back into the weight as PyTorch does): the exporters drop or change them", file=sys.stderr)
    if detached and not unmarked:
        print(f"ampc_export: the forward stops the gradient at {marks.marked} value(s) (detach(), torch.no_grad()): "
              "each is an ampc.StopGradient node", file=sys.stderr)
    model_dir = os.path.dirname(os.path.abspath(path))
    proto = onnx.load(path, load_external_data=False)
    # Only where a parameter has no initializer: one more forward and backward.
    pairs = trainable_initializers(module, proto, model_dir, functools.cache(lambda: unused_parameters(module, args)))
    initializer = dict(pairs)
    padding = {}
    for prefix, sub in module.named_modules():
        name = (prefix + "." if prefix else "") + "weight"
        if isinstance(sub, torch.nn.Embedding) and sub.padding_idx is not None and name in initializer:
            padding[initializer[name]] = int(sub.padding_idx)
    frozen = frozen_batchnorms(module, proto)
    written = {f"{c.__module__}.{c.__qualname__}" for c in functions} if marks.marks else set()
    custom = [c for c in custom_autograd_functions(module, args) if c not in written]
    if written:
        print("ampc_export: custom autograd Functions whose backward is dy times a tensor, elementwise (" + ", ".join(sorted(written)) +
              "): written as their forward's value with their backward's gradient", file=sys.stderr)
    if custom:
        print("ampc_export: the forward calls torch.autograd.Function subclasses with a backward of their own (" + ", ".join(custom) +
              "): ampc differentiates the forward they export instead", file=sys.stderr)
    keep = [(m.key, m.value) for m in proto.metadata_props if m.key not in (TRAINABLE_KEY, PADDING_KEY, CUSTOM_KEY, FROZEN_BN_KEY, UNMARKED_KEY, EXPORT_FALLBACK_KEY)]
    del proto.metadata_props[:]
    for k, v in keep:
        e = proto.metadata_props.add()
        e.key, e.value = k, v
    entry = proto.metadata_props.add()
    entry.key = TRAINABLE_KEY
    entry.value = json.dumps([init for _, init in pairs], ensure_ascii=False)
    if padding:
        entry = proto.metadata_props.add()
        entry.key = PADDING_KEY
        entry.value = json.dumps(padding, ensure_ascii=False)
    if unmarked:
        entry = proto.metadata_props.add()
        entry.key = UNMARKED_KEY
        entry.value = str(unmarked)
    if fallback:
        entry = proto.metadata_props.add()
        entry.key = EXPORT_FALLBACK_KEY
        entry.value = "torchscript; the dynamo exporter failed: " + fallback
    if frozen:
        entry = proto.metadata_props.add()
        entry.key = FROZEN_BN_KEY
        entry.value = json.dumps(frozen, ensure_ascii=False)
    if custom:
        entry = proto.metadata_props.add()
        entry.key = CUSTOM_KEY
        entry.value = json.dumps(custom, ensure_ascii=False)
    onnx.save(proto, path)
    return pairs
