#include "compiler/ops/grad.h"

#include "compiler/ops/registry.h"

namespace ampc {

std::string GradBuilder::base() const {
  return (node.name().empty() ? node.result(0)->name() : node.name()) + "_grad";
}

uint32_t noGradOperands(const Node& n) {
  return (n.def() ? n.def()->noGradOperands : 0) | static_cast<uint32_t>(n.getInt(kNoGradOperands, 0));
}

void GradBuilder::setGrad(size_t i, Value* v) {
  const Value* in = x(i);
  if (!in || !v) return;
  if (v->type() != in->type())
    fail("the gradient of input " + std::to_string(i) + " is " + v->type().str() + ", the input is " + in->type().str());
  dIn_[i] = v;
}

std::vector<Value*> GradBuilder::opN(const std::string& op, const std::vector<Value*>& ins,
                                     const std::map<std::string, Attribute>& attrs, const std::string& domain, size_t results) {
  std::vector<std::pair<std::string, TensorType>> res;
  for (size_t i = 0; i < results; ++i) res.emplace_back(g.uniqueName(base() + "/" + op + (results > 1 ? std::to_string(i) : "")), TensorType{});
  Node* n = g.createNode(op, domain, ins, res);
  n->setName(res[0].first);  // node and value names live apart: the node takes its first result's
  for (const auto& [k, a] : attrs) n->setAttr(k, a);
  if (!n->def()) throw Error("internal: gradient op " + domain + "::" + op + " is not in the registry");
  auto types = inferTypes(*n);
  std::vector<Value*> out;
  for (size_t i = 0; i < results; ++i) {
    n->result(i)->setType(types[i]);
    out.push_back(n->result(i));
  }
  return out;
}

Value* GradBuilder::op(const std::string& op, const std::vector<Value*>& ins, const std::map<std::string, Attribute>& attrs,
                       const std::string& domain) {
  return opN(op, ins, attrs, domain, 1)[0];
}

Value* GradBuilder::scalar(double v, DType t) {
  return g.addConst(g.uniqueName(base() + "/c"), Tensor::fromDoubles(t, {}, {v}));
}

Value* GradBuilder::ints(const std::vector<int64_t>& v) {
  return g.addConst(g.uniqueName(base() + "/i"), Tensor::fromInts(DType::i64, {static_cast<int64_t>(v.size())}, v));
}

Value* GradBuilder::cast(Value* v, DType t) {
  if (v->type().dtype == t) return v;
  return op("Cast", {v}, {{"to", static_cast<int64_t>(dtypeToOnnx(t))}});
}

Value* GradBuilder::zerosLike(Value* v) {
  return op("ConstantOfShape", {ints(v->type().shape)}, {{"value", Tensor::fromDoubles(v->type().dtype, {1}, {0.0})}});
}

Value* GradBuilder::reduceTo(Value* grad, const std::vector<int64_t>& shape) {
  const auto& gs = grad->type().shape;
  if (gs == shape) return grad;
  const size_t off = gs.size() - shape.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < gs.size(); ++i)
    if (i < off || (shape[i - off] == 1 && gs[i] != 1)) axes.push_back(static_cast<int64_t>(i));
  Value* r = axes.empty() ? grad : op("ReduceSum", {grad, ints(axes)}, {{"keepdims", int64_t{1}}});
  return r->type().shape == shape ? r : reshape(r, shape);
}

}  // namespace ampc
