#include "compiler/ir/ir.h"

#include <algorithm>
#include <cstring>
#include <queue>
#include <unordered_map>

#include "compiler/ops/registry.h"

namespace ampc {

int64_t TensorType::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool TensorType::sizeFits() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d > 0 && n > kMaxElements / d) return false;
    n *= d;
  }
  return true;
}

std::string TensorType::str() const {
  std::string s(dtypeName(dtype));
  s += '[';
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + ']';
}

namespace {
template <typename T>
T load(const Bytes& d, int64_t i) {
  T v;
  std::memcpy(&v, d.data() + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void store(Bytes& d, int64_t i, T v) {
  std::memcpy(d.data() + i * sizeof(T), &v, sizeof(T));
}
}  // namespace

double Tensor::getDouble(int64_t i) const {
  switch (type.dtype) {
    case DType::f64: return load<double>(data, i);
    case DType::f32: return load<float>(data, i);
    case DType::f16: return halfToFloat(load<uint16_t>(data, i));
    case DType::bf16: return bf16ToFloat(load<uint16_t>(data, i));
    case DType::i64: return static_cast<double>(load<int64_t>(data, i));
    case DType::i32: return load<int32_t>(data, i);
    case DType::i8: return load<int8_t>(data, i);
    case DType::u8: return load<uint8_t>(data, i);
    case DType::boolean: return load<uint8_t>(data, i) ? 1.0 : 0.0;
  }
  return 0;
}

int64_t Tensor::getInt(int64_t i) const {
  switch (type.dtype) {
    case DType::i64: return load<int64_t>(data, i);
    case DType::i32: return load<int32_t>(data, i);
    case DType::i8: return load<int8_t>(data, i);
    case DType::u8: return load<uint8_t>(data, i);
    case DType::boolean: return load<uint8_t>(data, i) ? 1 : 0;
    default: return static_cast<int64_t>(getDouble(i));
  }
}

void Tensor::setDouble(int64_t i, double v) {
  switch (type.dtype) {
    case DType::f64: store<double>(data, i, v); break;
    case DType::f32: store<float>(data, i, static_cast<float>(v)); break;
    case DType::f16: store<uint16_t>(data, i, floatToHalf(static_cast<float>(v))); break;
    case DType::bf16: store<uint16_t>(data, i, floatToBf16(static_cast<float>(v))); break;
    case DType::boolean: store<uint8_t>(data, i, v != 0.0); break;
    default: setInt(i, static_cast<int64_t>(v)); break;
  }
}

void Tensor::setInt(int64_t i, int64_t v) {
  switch (type.dtype) {
    case DType::i64: store<int64_t>(data, i, v); break;
    case DType::i32: store<int32_t>(data, i, static_cast<int32_t>(v)); break;
    case DType::i8: store<int8_t>(data, i, static_cast<int8_t>(v)); break;
    case DType::u8: store<uint8_t>(data, i, static_cast<uint8_t>(v)); break;
    case DType::boolean: store<uint8_t>(data, i, v != 0); break;
    default: setDouble(i, static_cast<double>(v)); break;
  }
}

std::vector<int64_t> Tensor::toInts() const {
  std::vector<int64_t> v(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) v[i] = getInt(i);
  return v;
}

Tensor Tensor::fromInts(DType t, const std::vector<int64_t>& shape, const std::vector<int64_t>& v) {
  Tensor r(TensorType{t, shape});
  for (int64_t i = 0; i < r.numel(); ++i) r.setInt(i, v.at(i));
  return r;
}

Tensor Tensor::fromDoubles(DType t, const std::vector<int64_t>& shape, const std::vector<double>& v) {
  Tensor r(TensorType{t, shape});
  for (int64_t i = 0; i < r.numel(); ++i) r.setDouble(i, v.at(i));
  return r;
}

// ---- Value

void Value::setData(Tensor t) { data_ = std::make_unique<Tensor>(std::move(t)); }

const Tensor* Value::constData() const {
  if (kind_ == ValueKind::Const || (kind_ == ValueKind::Param && !isFloat(type_.dtype))) return data();
  return nullptr;
}

void Value::replaceAllUsesWith(Value* other) {
  if (other == this) return;
  while (!uses_.empty()) {
    Use u = uses_.back();
    u.user->setInput(u.operand, other);
  }
  if (graph_) {
    for (size_t i = 0; i < graph_->outputs().size(); ++i)
      if (graph_->outputs()[i] == this) graph_->setOutput(i, other);
  }
}

// ---- Node

std::string Node::describe() const {
  return "node '" + name_ + "' (" + qualifiedOp() + ")";
}

void Node::setInput(size_t i, Value* v) {
  if (i >= inputs_.size()) inputs_.resize(i + 1, nullptr);
  if (Value* old = inputs_[i]) {
    auto& u = old->uses_;
    u.erase(std::find(u.begin(), u.end(), Use{this, static_cast<int>(i)}));
  }
  inputs_[i] = v;
  if (v) v->uses_.push_back(Use{this, static_cast<int>(i)});
}

const Attribute* Node::attr(const std::string& n) const {
  auto it = attrs_.find(n);
  return it == attrs_.end() ? nullptr : &it->second;
}

namespace {
template <typename T>
const T& typedAttr(const Node& node, const std::string& n, const Attribute& a, const char* want) {
  if (const T* p = std::get_if<T>(&a)) return *p;
  throw Error(node.describe() + ": attribute '" + n + "' must be " + want);
}
}  // namespace

int64_t Node::getInt(const std::string& n, int64_t dflt) const {
  const Attribute* a = attr(n);
  return a ? typedAttr<int64_t>(*this, n, *a, "an int") : dflt;
}
float Node::getFloat(const std::string& n, float dflt) const {
  const Attribute* a = attr(n);
  return a ? typedAttr<float>(*this, n, *a, "a float") : dflt;
}
std::string Node::getString(const std::string& n, const std::string& dflt) const {
  const Attribute* a = attr(n);
  return a ? typedAttr<std::string>(*this, n, *a, "a string") : dflt;
}
std::vector<int64_t> Node::getInts(const std::string& n, const std::vector<int64_t>& dflt) const {
  const Attribute* a = attr(n);
  return a ? typedAttr<std::vector<int64_t>>(*this, n, *a, "a list of ints") : dflt;
}

// ---- Graph

void Graph::registerName(Value* v) {
  if (v->name().empty()) throw Error("a value has an empty name");
  if (!byName_.emplace(v->name(), v).second) throw Error("value '" + v->name() + "' is defined twice");
  v->graph_ = this;
}

Value* Graph::addGraphValue(const std::string& name, TensorType type, ValueKind kind, std::vector<Value*>& list) {
  auto v = std::unique_ptr<Value>(new Value(name, std::move(type), kind));
  registerName(v.get());
  list.push_back(v.get());
  owned_.push_back(std::move(v));
  return list.back();
}

Value* Graph::addInput(const std::string& name, TensorType type) {
  return addGraphValue(name, std::move(type), ValueKind::Input, inputs_);
}
Value* Graph::addParamDecl(const std::string& name, TensorType type) {
  return addGraphValue(name, std::move(type), ValueKind::Param, params_);
}
Value* Graph::addParam(const std::string& name, Tensor init) {
  Value* v = addParamDecl(name, init.type);
  v->setData(std::move(init));
  return v;
}
Value* Graph::addConstDecl(const std::string& name, TensorType type) {
  return addGraphValue(name, std::move(type), ValueKind::Const, consts_);
}
Value* Graph::addConst(const std::string& name, Tensor data) {
  Value* v = addConstDecl(name, data.type);
  v->setData(std::move(data));
  return v;
}

void Graph::eraseGraphValue(Value* v) {
  if (!v->uses().empty() || std::count(outputs_.begin(), outputs_.end(), v))
    throw Error("internal: erasing value '" + v->name() + "' that is still used");
  auto& list = v->kind() == ValueKind::Param ? params_ : v->kind() == ValueKind::Const ? consts_ : inputs_;
  list.erase(std::find(list.begin(), list.end(), v));
  byName_.erase(v->name());
  owned_.erase(std::find_if(owned_.begin(), owned_.end(), [v](const auto& p) { return p.get() == v; }));
}

Node* Graph::createNode(const std::string& op, const std::string& domain, const std::vector<Value*>& inputs,
                        const std::vector<std::pair<std::string, TensorType>>& results, Node* before) {
  auto owned = std::unique_ptr<Node>(new Node());
  Node* n = owned.get();
  n->op_ = op;
  n->domain_ = domain;
  n->graph_ = this;
  for (size_t i = 0; i < inputs.size(); ++i) n->setInput(i, inputs[i]);
  for (size_t i = 0; i < results.size(); ++i) {
    auto v = std::unique_ptr<Value>(new Value(results[i].first, results[i].second, ValueKind::Result));
    v->producer_ = n;
    v->resultIndex_ = static_cast<int>(i);
    registerName(v.get());
    n->results_.push_back(std::move(v));
  }
  auto pos = before ? before->self_ : nodes_.end();
  n->self_ = nodes_.insert(pos, std::move(owned));
  n->def_ = lookupOp(domain, op, domain.empty() ? opset : (domainOpsets.count(domain) ? domainOpsets.at(domain) : 1));
  return n;
}

Node* Graph::copyNode(const Node& n, const std::vector<Value*>& inputs, const std::vector<std::pair<std::string, TensorType>>& results,
                      Node* before) {
  Node* c = createNode(n.op(), n.domain(), inputs, results, before);
  c->setName(n.name());
  for (const auto& [k, a] : n.attrs()) c->setAttr(k, a);
  return c;
}

Value* Graph::addResult(Node* n, const std::string& name, TensorType type) {
  auto v = std::unique_ptr<Value>(new Value(name, std::move(type), ValueKind::Result));
  v->producer_ = n;
  v->resultIndex_ = static_cast<int>(n->results_.size());
  registerName(v.get());
  n->results_.push_back(std::move(v));
  return n->results_.back().get();
}

Node* Graph::nodeAfter(const Node* n) const {
  if (n->graph_ != this) throw Error("internal: " + n->describe() + " is not a node of this graph");
  auto it = std::next(n->self_);
  return it == nodes_.end() ? nullptr : it->get();
}

void Graph::eraseNode(Node* n) {
  for (auto& r : n->results_) {
    if (!r->uses().empty() || std::count(outputs_.begin(), outputs_.end(), r.get()))
      throw Error("internal: erasing " + n->describe() + " whose result '" + r->name() + "' is still used");
  }
  for (size_t i = 0; i < n->inputs_.size(); ++i) n->setInput(i, nullptr);
  for (auto& r : n->results_) byName_.erase(r->name());
  nodes_.erase(n->self_);
}

void Graph::sortNodes() {
  std::unordered_map<const Node*, size_t> index;
  std::vector<Node*> byIndex;
  for (const auto& n : nodes_) {
    index.emplace(n.get(), byIndex.size());
    byIndex.push_back(n.get());
  }
  // Kahn's algorithm, always taking the earliest ready node: stable where the order holds.
  std::vector<size_t> waiting(byIndex.size(), 0);
  std::vector<std::vector<size_t>> readers(byIndex.size());
  for (size_t i = 0; i < byIndex.size(); ++i) {
    std::vector<size_t> producers;
    for (const Value* v : byIndex[i]->inputs())
      if (v && v->producer()) producers.push_back(index.at(v->producer()));
    std::sort(producers.begin(), producers.end());
    producers.erase(std::unique(producers.begin(), producers.end()), producers.end());
    waiting[i] = producers.size();
    for (size_t p : producers) readers[p].push_back(i);
  }
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
  for (size_t i = 0; i < byIndex.size(); ++i)
    if (waiting[i] == 0) ready.push(i);
  std::list<std::unique_ptr<Node>> sorted;
  while (!ready.empty()) {
    const size_t i = ready.top();
    ready.pop();
    sorted.splice(sorted.end(), nodes_, byIndex[i]->self_);
    for (size_t r : readers[i])
      if (--waiting[r] == 0) ready.push(r);
  }
  if (!nodes_.empty()) {
    const std::string who = nodes_.front()->describe();
    nodes_.splice(nodes_.begin(), sorted);  // leave the graph whole
    throw Error("internal: the graph has a cycle through " + who);
  }
  nodes_.swap(sorted);
}

Value* Graph::lookup(const std::string& name) const {
  auto it = byName_.find(name);
  return it == byName_.end() ? nullptr : it->second;
}

void Graph::renameValue(Value* v, const std::string& name) {
  if (v->name_ == name) return;
  if (lookup(name)) throw Error("value '" + name + "' is defined twice");
  byName_.erase(v->name_);
  v->name_ = name;
  byName_.emplace(name, v);
}

std::string Graph::uniqueName(const std::string& base) const {
  if (!lookup(base)) return base;
  for (int i = 1;; ++i) {
    std::string s = base + "_" + std::to_string(i);
    if (!lookup(s)) return s;
  }
}

void Graph::bindOps() {
  for (auto& n : nodes_) {
    int ver = n->domain_.empty() ? opset : (domainOpsets.count(n->domain_) ? domainOpsets.at(n->domain_) : 1);
    n->def_ = lookupOp(n->domain_, n->op_, ver);
  }
}

}  // namespace ampc
