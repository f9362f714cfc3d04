#include "compiler/codegen/nvptx.h"

#include <cstdlib>
#include <filesystem>
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>

#include "compiler/ops/pointwise.h"

#ifdef AMPC_HAVE_LLVM
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Metadata.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Linker/Linker.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>
#endif

#ifndef AMPC_LIBDEVICE_DEFAULT
#define AMPC_LIBDEVICE_DEFAULT ""
#endif

namespace ampc::codegen {

std::string libdevicePath() {
  const char* env = std::getenv("AMPC_LIBDEVICE");
  if (env && std::string_view(env) == "none") return "";  // as on a machine without the CUDA toolkit
  for (const char* p : std::initializer_list<const char*>{env, AMPC_LIBDEVICE_DEFAULT, "/usr/local/cuda/nvvm/libdevice/libdevice.10.bc"}) {
    std::error_code ec;
    if (p && *p && std::filesystem::is_regular_file(p, ec)) return p;
  }
  return "";
}

#ifndef AMPC_HAVE_LLVM

bool available() { return false; }
Kernel fusedKernel(const Node& fused, const std::string&) {
  throw Error(fused.describe() + ": this ampc was built without LLVM, so it cannot generate the kernel");
}

#else

bool available() { return true; }

namespace {
// libdevice's bytes, read once (the path does not change within a process); shared read-only by the
// kernels generated in parallel.
const llvm::MemoryBuffer& libdeviceBytes(const std::string& path) {
  static std::mutex m;
  static std::map<std::string, std::unique_ptr<llvm::MemoryBuffer>> read;
  std::lock_guard<std::mutex> lock(m);
  auto& b = read[path];
  if (!b) {
    auto buf = llvm::MemoryBuffer::getFile(path);
    if (!buf) {
      read.erase(path);
      throw Error(path + ": cannot read libdevice: " + buf.getError().message());
    }
    b = std::move(*buf);
  }
  return *b;
}

constexpr const char* kTriple = "nvptx64-nvidia-cuda";

void initTarget() {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
  });
}

// The pointwise builder over LLVM IR: f32 values and i1 predicates.
class Emitter final : public PwBuilder {
 public:
  Emitter(llvm::IRBuilder<>& b, llvm::Module& m, const Node& node) : b_(b), m_(m), node_(node) {}

  bool usesLibdevice = false;

  PwValue put(llvm::Value* v) {
    vals_.push_back(v);
    return PwValue{static_cast<int>(vals_.size() - 1)};
  }
  llvm::Value* get(PwValue v) const {
    if (!v.present() || static_cast<size_t>(v.id) >= vals_.size()) throw Error(node_.describe() + ": a formula read an absent operand");
    return vals_[static_cast<size_t>(v.id)];
  }
  bool isPredicate(PwValue v) const { return get(v)->getType()->isIntegerTy(1); }

  PwValue constant(float v) override { return put(llvm::ConstantFP::get(b_.getFloatTy(), v)); }

  PwValue math(PwMath op, PwValue a, PwValue c) override {
    llvm::Value* x = get(a);
    switch (op) {
      case PwMath::Add: return put(b_.CreateFAdd(x, get(c)));
      case PwMath::Sub: return put(b_.CreateFSub(x, get(c)));
      case PwMath::Mul: return put(b_.CreateFMul(x, get(c)));
      case PwMath::Div: return put(b_.CreateFDiv(x, get(c)));
      case PwMath::Pow: {  // in f64, as the CPU reference
        llvm::Value* r = call("__nv_pow", {b_.CreateFPExt(x, b_.getDoubleTy()), b_.CreateFPExt(get(c), b_.getDoubleTy())});
        return put(b_.CreateFPTrunc(r, b_.getFloatTy()));
      }
      case PwMath::Neg: return put(b_.CreateFNeg(x));
      case PwMath::Sqrt: return put(b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x));  // sqrt.rn.f32
      case PwMath::Floor: return put(b_.CreateUnaryIntrinsic(llvm::Intrinsic::floor, x));
      case PwMath::Ceil: return put(b_.CreateUnaryIntrinsic(llvm::Intrinsic::ceil, x));
      case PwMath::Rint: return put(b_.CreateUnaryIntrinsic(llvm::Intrinsic::rint, x));
      case PwMath::Exp: return put(call("__nv_expf", {x}));
      case PwMath::Log: return put(call("__nv_logf", {x}));
      case PwMath::Tanh: return put(call("__nv_tanhf", {x}));
      case PwMath::Erf: return put(call("__nv_erff", {x}));
      case PwMath::Sin: return put(call("__nv_sinf", {x}));
      case PwMath::Cos: return put(call("__nv_cosf", {x}));
      case PwMath::Log1p: return put(call("__nv_log1pf", {x}));
      case PwMath::Expm1: return put(call("__nv_expm1f", {x}));
      case PwMath::Tan: return put(call("__nv_tanf", {x}));
      case PwMath::Asin: return put(call("__nv_asinf", {x}));
      case PwMath::Acos: return put(call("__nv_acosf", {x}));
      case PwMath::Atan: return put(call("__nv_atanf", {x}));
      case PwMath::Sinh: return put(call("__nv_sinhf", {x}));
      case PwMath::Cosh: return put(call("__nv_coshf", {x}));
      case PwMath::Asinh: return put(call("__nv_asinhf", {x}));
      case PwMath::Acosh: return put(call("__nv_acoshf", {x}));
      case PwMath::Atanh: return put(call("__nv_atanhf", {x}));
    }
    throw Error(node_.describe() + ": unknown pointwise operation");
  }

  PwValue compare(PwCmp c, PwValue a, PwValue d) override {
    llvm::Value *x = get(a), *y = get(d);
    switch (c) {
      case PwCmp::Eq: return put(b_.CreateFCmpOEQ(x, y));
      case PwCmp::Lt: return put(b_.CreateFCmpOLT(x, y));
      case PwCmp::Le: return put(b_.CreateFCmpOLE(x, y));
      case PwCmp::Gt: return put(b_.CreateFCmpOGT(x, y));
      case PwCmp::Ge: return put(b_.CreateFCmpOGE(x, y));
      case PwCmp::Unordered: return put(b_.CreateFCmpUNO(x, y));
    }
    throw Error(node_.describe() + ": unknown comparison");
  }
  PwValue logic(PwLogic op, PwValue a, PwValue c) override {
    switch (op) {
      case PwLogic::And: return put(b_.CreateAnd(get(a), get(c)));
      case PwLogic::Or: return put(b_.CreateOr(get(a), get(c)));
      case PwLogic::Not: return put(b_.CreateNot(get(a)));
    }
    throw Error(node_.describe() + ": unknown logic operation");
  }
  PwValue select(PwValue cond, PwValue a, PwValue c) override { return put(b_.CreateSelect(get(cond), get(a), get(c))); }
  PwValue toPredicate(PwValue f) override { return put(b_.CreateFCmpUNE(get(f), llvm::ConstantFP::get(b_.getFloatTy(), 0.0))); }
  PwValue fromPredicate(PwValue p) override { return put(b_.CreateUIToFP(get(p), b_.getFloatTy())); }

 private:
  llvm::Value* call(const char* fn, std::vector<llvm::Value*> args) {
    usesLibdevice = true;
    std::vector<llvm::Type*> types;
    for (auto* a : args) types.push_back(a->getType());
    auto callee = m_.getOrInsertFunction(fn, llvm::FunctionType::get(args[0]->getType(), types, false));
    return b_.CreateCall(callee, args);
  }

  llvm::IRBuilder<>& b_;
  llvm::Module& m_;
  const Node& node_;
  std::vector<llvm::Value*> vals_;
};

// bf16 <-> f32 by bits: round to nearest even (a NaN stays a quiet NaN), as kernels/cpu/convert.
llvm::Value* bf16Bits(llvm::IRBuilder<>& b, llvm::Value* f) {
  llvm::Value* u = b.CreateBitCast(f, b.getInt32Ty());
  llvm::Value* lsb = b.CreateAnd(b.CreateLShr(u, 16), 1);
  llvm::Value* rounded = b.CreateLShr(b.CreateAdd(u, b.CreateAdd(lsb, b.getInt32(0x7fff))), 16);
  llvm::Value* nan = b.CreateFCmpUNO(f, f);
  llvm::Value* quiet = b.CreateOr(b.CreateLShr(u, 16), 0x40);
  return b.CreateTrunc(b.CreateSelect(nan, quiet, rounded), b.getInt16Ty());
}
llvm::Value* bf16ToFloat(llvm::IRBuilder<>& b, llvm::Value* bits16) {
  return b.CreateBitCast(b.CreateShl(b.CreateZExt(bits16, b.getInt32Ty()), 16), b.getFloatTy());
}
// A value rounded to dtype t and widened back (the node's own rounding).
llvm::Value* roundTo(llvm::IRBuilder<>& b, llvm::Value* f, DType t) {
  if (t == DType::f16) return b.CreateFPExt(b.CreateFPTrunc(f, b.getHalfTy()), b.getFloatTy());
  if (t == DType::bf16) return bf16ToFloat(b, bf16Bits(b, f));
  return f;
}

llvm::Type* storageType(llvm::IRBuilder<>& b, DType t) {
  switch (t) {
    case DType::f32: return b.getFloatTy();
    case DType::f16: return b.getHalfTy();
    case DType::bf16: return b.getInt16Ty();
    case DType::boolean: return b.getInt8Ty();
    default: throw Error(std::string("codegen: a generated kernel cannot hold ") + std::string(dtypeName(t)) + " values");
  }
}

// Operand offset for domain element i: the operand's dims (right-aligned) that are not broadcast,
// adjacent ones merged, each contributing ((i / inner) % size) * stride; all constants.
llvm::Value* operandOffset(llvm::IRBuilder<>& b, llvm::Value* i, const std::vector<int64_t>& domain, const std::vector<int64_t>& shape) {
  const size_t R = domain.size();
  std::vector<int64_t> s(R, 1);
  for (size_t k = 0; k < shape.size(); ++k) s[R - shape.size() + k] = shape[k];
  if (s == domain) return i;
  llvm::Type* it = i->getType();
  llvm::Value* off = llvm::ConstantInt::get(it, 0);
  int64_t inner = 1, stride = 1;  // the domain's and the operand's element strides of dim k
  for (size_t kk = R; kk-- > 0;) {
    if (domain[kk] == 1) continue;
    if (s[kk] == 1) {
      inner *= domain[kk];
      continue;
    }
    // Merge the run of full dims ending here.
    int64_t size = domain[kk];
    size_t j = kk;
    while (j > 0 && (domain[j - 1] == 1 || s[j - 1] == domain[j - 1])) {
      --j;
      size *= domain[j];
    }
    llvm::Value* q = inner == 1 ? i : b.CreateUDiv(i, llvm::ConstantInt::get(it, inner));
    const int64_t total = [&] {
      int64_t t = 1;
      for (size_t d = 0; d < R; ++d) t *= domain[d];
      return t;
    }();
    if (inner * size != total) q = b.CreateURem(q, llvm::ConstantInt::get(it, size));
    llvm::Value* term = stride == 1 ? q : b.CreateMul(q, llvm::ConstantInt::get(it, stride));
    off = b.CreateAdd(off, term);
    inner *= size;
    stride *= size;
    kk = j;
  }
  return off;
}

std::unique_ptr<llvm::TargetMachine> targetMachine() {
  std::string err;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(kTriple, err);
  if (!target) throw Error("NVPTX code generation: " + err);
  llvm::TargetOptions opts;
  return std::unique_ptr<llvm::TargetMachine>(
      target->createTargetMachine(kTriple, "sm_90", "+ptx80", opts, std::nullopt, std::nullopt, llvm::CodeGenOptLevel::Aggressive));
}

llvm::Value* widen(llvm::IRBuilder<>& b, llvm::Value* raw, DType t) {
  if (t == DType::boolean) return b.CreateICmpNE(raw, b.getInt8(0));
  if (t == DType::bf16) return bf16ToFloat(b, raw);
  if (t == DType::f16) return b.CreateFPExt(raw, b.getFloatTy());
  return raw;
}
llvm::Value* narrow(llvm::IRBuilder<>& b, llvm::Value* x, DType t) {
  if (t == DType::boolean) return b.CreateZExt(x, b.getInt8Ty());
  if (t == DType::bf16) return bf16Bits(b, x);
  if (t == DType::f16) return b.CreateFPTrunc(x, b.getHalfTy());
  return x;
}

// One kernel entry over the body: each thread takes V consecutive elements per iteration of a
// grid-stride loop over the n / V chunks (V > 1 only where V divides n). Operands of the domain's
// shape and the results move as one V-element vector each (the caller launches this entry only
// where their addresses are aligned to it); broadcast operands are read element by element.
llvm::Function* emitKernel(llvm::Module& mod, const Node& fused, const Graph& body, const std::vector<int64_t>& domain, int64_t n,
                           const std::string& name, int V, int threads, bool& usesLibdevice) {
  llvm::LLVMContext& ctx = mod.getContext();
  llvm::IRBuilder<> b(ctx);
  const size_t nin = body.inputs().size(), nout = body.outputs().size();
  llvm::PointerType* global = llvm::PointerType::get(ctx, 1);
  std::vector<llvm::Type*> params(nin + nout, global);
  auto* fn = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), params, false), llvm::Function::ExternalLinkage, name, mod);
  for (size_t p = 0; p < nin + nout; ++p) {
    fn->addParamAttr(static_cast<unsigned>(p), llvm::Attribute::NoAlias);  // outputs never alias operands (no in-place)
    if (p < nin) fn->addParamAttr(static_cast<unsigned>(p), llvm::Attribute::ReadOnly);
  }
  auto* i32 = b.getInt32Ty();
  llvm::NamedMDNode* ann = mod.getOrInsertNamedMetadata("nvvm.annotations");
  ann->addOperand(llvm::MDNode::get(ctx, {llvm::ValueAsMetadata::get(fn), llvm::MDString::get(ctx, "kernel"),
                                         llvm::ConstantAsMetadata::get(llvm::ConstantInt::get(i32, 1))}));
  ann->addOperand(llvm::MDNode::get(ctx, {llvm::ValueAsMetadata::get(fn), llvm::MDString::get(ctx, "maxntidx"),
                                         llvm::ConstantAsMetadata::get(llvm::ConstantInt::get(i32, threads))}));

  // Indices in i32 while the domain and the grid's stride leave room (the runtime's grid is at most
  // 2^20 threads), else i64.
  const bool narrowIndex = n < (int64_t{1} << 30);
  llvm::Type* it = narrowIndex ? static_cast<llvm::Type*>(i32) : b.getInt64Ty();
  auto* entry = llvm::BasicBlock::Create(ctx, "entry", fn);
  auto* loop = llvm::BasicBlock::Create(ctx, "loop", fn);
  auto* work = llvm::BasicBlock::Create(ctx, "work", fn);
  auto* done = llvm::BasicBlock::Create(ctx, "done", fn);
  b.SetInsertPoint(entry);
  auto sreg = [&](llvm::Intrinsic::ID id) { return b.CreateZExt(b.CreateIntrinsic(i32, id, {}), it); };
  llvm::Value* ntid = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x);
  llvm::Value* first = b.CreateAdd(b.CreateMul(sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x), ntid), sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x));
  llvm::Value* step = b.CreateMul(sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x), ntid);
  b.CreateBr(loop);
  b.SetInsertPoint(loop);
  llvm::PHINode* c = b.CreatePHI(it, 2);
  c->addIncoming(first, entry);
  b.CreateCondBr(b.CreateICmpULT(c, llvm::ConstantInt::get(it, static_cast<uint64_t>(n / V))), work, done);
  b.SetInsertPoint(work);
  llvm::Value* base = V == 1 ? static_cast<llvm::Value*>(c) : b.CreateMul(c, llvm::ConstantInt::get(it, V));
  auto lane = [&](int j) { return j == 0 ? base : b.CreateAdd(base, llvm::ConstantInt::get(it, j)); };
  auto isFull = [&](const Value* v) { return v->type().numel() == n; };

  Emitter em(b, mod, fused);
  std::vector<std::map<const Value*, PwValue>> at(static_cast<size_t>(V));
  for (size_t p = 0; p < nin; ++p) {
    const Value* v = body.inputs()[p];
    llvm::Type* st = storageType(b, v->type().dtype);
    if (!st) throw Error(fused.describe() + ": operand " + std::to_string(p) + " is " + v->type().str());
    llvm::Value* ptr = fn->getArg(static_cast<unsigned>(p));
    const uint64_t size = dtypeSize(v->type().dtype);
    if (V > 1 && isFull(v)) {
      auto* vt = llvm::FixedVectorType::get(st, static_cast<unsigned>(V));
      llvm::Value* vec = b.CreateAlignedLoad(vt, b.CreateInBoundsGEP(st, ptr, {base}), llvm::Align(size * static_cast<uint64_t>(V)));
      for (int j = 0; j < V; ++j) at[static_cast<size_t>(j)][v] = em.put(widen(b, b.CreateExtractElement(vec, static_cast<uint64_t>(j)), v->type().dtype));
    } else {
      for (int j = 0; j < V; ++j) {
        llvm::Value* raw = b.CreateLoad(st, b.CreateInBoundsGEP(st, ptr, {operandOffset(b, lane(j), domain, v->type().shape)}));
        at[static_cast<size_t>(j)][v] = em.put(widen(b, raw, v->type().dtype));
      }
    }
  }
  for (const Value* k : body.consts()) {
    if (!k->data() || k->type().numel() != 1) throw Error(fused.describe() + ": body constant '" + k->name() + "' is not one element");
    const double d = k->data()->getDouble(0);
    const PwValue kv = k->type().dtype == DType::boolean ? em.put(b.getInt1(d != 0)) : em.constant(static_cast<float>(d));
    for (auto& m : at) m[k] = kv;
  }
  for (int j = 0; j < V; ++j) {
    auto& m = at[static_cast<size_t>(j)];
    for (const auto& node : body.nodes()) {
      std::vector<PwValue> in;
      for (const Value* v : node->inputs()) in.push_back(v ? m.at(v) : PwValue{});
      PointwiseFn f = pointwiseFormula(*node);
      if (!f) throw Error(fused.describe() + ": body node " + node->describe() + " has no pointwise formula");
      PwValue r = f(em, *node, in);
      const DType t = node->result(0)->type().dtype;
      if (em.isPredicate(r) != (t == DType::boolean))
        throw Error(fused.describe() + ": body node " + node->describe() + "'s formula gives the wrong kind of value");
      if (t != DType::boolean) r = em.put(roundTo(b, em.get(r), t));
      m[node->result(0)] = r;
    }
  }
  for (size_t o = 0; o < nout; ++o) {
    const Value* v = body.outputs()[o];
    const DType t = v->type().dtype;
    llvm::Type* st = storageType(b, t);
    llvm::Value* ptr = fn->getArg(static_cast<unsigned>(nin + o));
    if (V == 1) {
      b.CreateStore(narrow(b, em.get(at[0].at(v)), t), b.CreateInBoundsGEP(st, ptr, {base}));
      continue;
    }
    llvm::Value* vec = llvm::PoisonValue::get(llvm::FixedVectorType::get(st, static_cast<unsigned>(V)));
    for (int j = 0; j < V; ++j) vec = b.CreateInsertElement(vec, narrow(b, em.get(at[static_cast<size_t>(j)].at(v)), t), static_cast<uint64_t>(j));
    b.CreateAlignedStore(vec, b.CreateInBoundsGEP(st, ptr, {base}), llvm::Align(dtypeSize(t) * static_cast<uint64_t>(V)));
  }
  c->addIncoming(b.CreateAdd(c, step), b.GetInsertBlock());
  b.CreateBr(loop);
  b.SetInsertPoint(done);
  b.CreateRetVoid();
  usesLibdevice = usesLibdevice || em.usesLibdevice;
  return fn;
}

}  // namespace

Kernel fusedKernel(const Node& fused, const std::string& name) {
  initTarget();
  const auto body = fusedBody(fused);
  const std::vector<int64_t>& domain = fused.result(0)->type().shape;
  for (size_t r = 0; r < fused.numResults(); ++r)
    if (fused.result(r)->type().shape != domain) throw Error(fused.describe() + ": its results differ in shape");
  int64_t n = 1;
  for (int64_t d : domain) n *= d;
  Kernel k;
  k.name = name;
  k.elements = n;
  // The vector entry: V elements per thread, 16 bytes of the narrowest full operand or result
  // (at most 8 elements), where V divides n.
  size_t narrowest = 4;
  for (const auto* list : {&body->inputs(), &body->outputs()})
    for (const Value* v : *list)
      if (v->type().numel() == n) narrowest = std::min(narrowest, dtypeSize(v->type().dtype));
  const int V = static_cast<int>(std::min<size_t>(8, 16 / std::max<size_t>(narrowest, 1)));
  if (n % V == 0 && V > 1) {
    k.vectorName = name + "_v" + std::to_string(V);
    k.vector = V;
  }

  llvm::LLVMContext ctx;
  auto mod = std::make_unique<llvm::Module>("ampc_fused", ctx);
  auto tm = targetMachine();
  mod->setTargetTriple(kTriple);
  mod->setDataLayout(tm->createDataLayout());
  mod->addModuleFlag(llvm::Module::Override, "nvvm-reflect-ftz", static_cast<uint32_t>(0));
  bool usesLibdevice = false;
  std::vector<llvm::Function*> entries{emitKernel(*mod, fused, *body, domain, n, name, 1, k.threads, usesLibdevice)};
  if (k.vector > 1) entries.push_back(emitKernel(*mod, fused, *body, domain, n, k.vectorName, k.vector, k.threads, usesLibdevice));

  if (usesLibdevice) {
    const std::string path = libdevicePath();
    if (path.empty())
      throw NoLibdevice(fused.describe() + ": its formulas need libdevice (CUDA's nvvm/libdevice/libdevice.10.bc), and none was found; set AMPC_LIBDEVICE");
    // Read once per process; each kernel takes it lazily, so that linking materialises only the
    // functions the kernel calls (parsing all of libdevice for every kernel was ~40% of a plan's
    // compile time, 1,000-node RNN: 3.9 s).
    const llvm::MemoryBuffer& bytes = libdeviceBytes(path);
    auto lib = llvm::getLazyBitcodeModule(bytes.getMemBufferRef(), ctx);
    if (!lib) throw Error(path + ": not LLVM bitcode: " + llvm::toString(lib.takeError()));
    (*lib)->setTargetTriple(kTriple);
    (*lib)->setDataLayout(mod->getDataLayout());
    if (llvm::Linker::linkModules(*mod, std::move(*lib), llvm::Linker::Flags::LinkOnlyNeeded))
      throw Error(path + ": linking libdevice failed");
  }
  for (llvm::Function& f : *mod)
    if (std::find(entries.begin(), entries.end(), &f) == entries.end() && !f.isDeclaration()) {  // libdevice's: private to the kernel and inlined into it
      f.setLinkage(llvm::GlobalValue::InternalLinkage);
      f.removeFnAttr(llvm::Attribute::NoInline);
      f.removeFnAttr(llvm::Attribute::OptimizeNone);
      f.addFnAttr(llvm::Attribute::AlwaysInline);
    }
  std::string verr;
  llvm::raw_string_ostream vs(verr);
  if (llvm::verifyModule(*mod, &vs)) throw Error(fused.describe() + ": internal: the generated kernel does not verify: " + verr);

  {  // O3, with the target's own passes (NVVMReflect resolves libdevice's __nvvm_reflect)
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PassBuilder pb(tm.get());
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
    mpm.run(*mod, mam);
  }
  llvm::SmallString<0> out;
  {
    llvm::raw_svector_ostream os(out);
    llvm::legacy::PassManager pm;
    if (tm->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::AssemblyFile))
      throw Error("NVPTX code generation: the target cannot emit PTX");
    pm.run(*mod);
  }
  k.ptx.assign(out.begin(), out.end());
  return k;
}

#endif

}  // namespace ampc::codegen
