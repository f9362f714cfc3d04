// The IR: a Graph owns Nodes in topological order; a Node has an op, attributes, operand Value*s
// and result Values; a Value has a TensorType (DType + static shape) and a use list.
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <map>
#include <set>
#include <optional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "compiler/ir/bytes.h"
#include "compiler/ir/dtype.h"

namespace ampc {

// Every user-facing failure (bad model, bad text, bad shape) is an Error; the CLI prints what()
// and exits 1. Messages name the file, the node and the op where they are known.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TensorType {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;  // static; rank 0 is a scalar

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const;
  // False if a dim is negative or the element count exceeds kMaxElements (it cannot be allocated,
  // and numel() could overflow): callers reject such types before using numel().
  bool sizeFits() const;
  static constexpr int64_t kMaxElements = int64_t{1} << 40;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtypeSize(dtype); }
  std::string str() const;  // "f32[2,3]", "i64[]"
  bool operator==(const TensorType&) const = default;
};

// A dense tensor value (initializers, constants, tensor attributes), little-endian raw bytes.
struct Tensor {
  TensorType type;
  Bytes data;  // type.bytes() long; shared by copies (copy on write), possibly a view of a mapped file

  Tensor() = default;
  explicit Tensor(TensorType t) : type(std::move(t)), data(type.bytes()) {}

  int64_t numel() const { return type.numel(); }
  // Element i widened to double / int64 (any dtype; floats are truncated for toInt).
  double getDouble(int64_t i) const;
  int64_t getInt(int64_t i) const;
  // Element i set from a double (rounded to the storage type, RNE for f16/bf16).
  void setDouble(int64_t i, double v);
  void setInt(int64_t i, int64_t v);
  std::vector<int64_t> toInts() const;

  static Tensor fromInts(DType t, const std::vector<int64_t>& shape, const std::vector<int64_t>& v);
  static Tensor fromDoubles(DType t, const std::vector<int64_t>& shape, const std::vector<double>& v);
  bool operator==(const Tensor&) const = default;
};

using Attribute = std::variant<int64_t, float, std::string, std::vector<int64_t>, std::vector<float>,
                               std::vector<std::string>, Tensor>;

class Node;
class Graph;

enum class ValueKind : uint8_t {
  Input,   // graph input (data fed each step)
  Param,   // initializer: trainable parameter or state, owns its initial data
  Const,   // constant (ONNX Constant node or folded value), owns its data
  Result,  // produced by a node
};

struct Use {
  Node* user;
  int operand;
  bool operator==(const Use&) const = default;
};

class Value {
 public:
  const std::string& name() const { return name_; }
  const TensorType& type() const { return type_; }
  void setType(TensorType t) { type_ = std::move(t); }
  ValueKind kind() const { return kind_; }
  Node* producer() const { return producer_; }  // null unless kind() == Result
  int resultIndex() const { return resultIndex_; }
  const std::vector<Use>& uses() const { return uses_; }

  // Initial data of a Param / data of a Const; null if absent (an elided constant of the text form).
  const Tensor* data() const { return data_ ? &*data_ : nullptr; }
  void setData(Tensor t);
  // The data if this value is a compile-time constant: a Const, or a Param that is not a float.
  const Tensor* constData() const;

  // Points every use (and graph output) of this value at `other`.
  void replaceAllUsesWith(Value* other);

 private:
  friend class Node;
  friend class Graph;
  Value(std::string name, TensorType type, ValueKind kind) : name_(std::move(name)), type_(std::move(type)), kind_(kind) {}

  std::string name_;
  TensorType type_;
  ValueKind kind_;
  Node* producer_ = nullptr;
  int resultIndex_ = -1;
  std::vector<Use> uses_;
  std::unique_ptr<Tensor> data_;
  Graph* graph_ = nullptr;
};

struct OpDef;  // compiler/ops/registry.h

class Node {
 public:
  const std::string& op() const { return op_; }
  const std::string& domain() const { return domain_; }  // "" is the default ONNX domain
  std::string qualifiedOp() const { return domain_.empty() ? op_ : domain_ + "." + op_; }
  const std::string& name() const { return name_; }
  void setName(std::string n) { name_ = std::move(n); }
  // "node '/fc1/Gemm' (Gemm)": how errors name a node.
  std::string describe() const;

  // Operands; null marks an omitted optional input (ONNX's empty name).
  const std::vector<Value*>& inputs() const { return inputs_; }
  Value* input(size_t i) const { return i < inputs_.size() ? inputs_[i] : nullptr; }
  size_t numInputs() const { return inputs_.size(); }
  void setInput(size_t i, Value* v);

  size_t numResults() const { return results_.size(); }
  Value* result(size_t i) const { return results_[i].get(); }

  const std::map<std::string, Attribute>& attrs() const { return attrs_; }
  bool hasAttr(const std::string& n) const { return attrs_.count(n) != 0; }
  void setAttr(const std::string& n, Attribute a) { attrs_[n] = std::move(a); }
  void removeAttr(const std::string& n) { attrs_.erase(n); }
  const Attribute* attr(const std::string& n) const;
  // Typed getters with defaults; a present attribute of the wrong kind is an Error naming the node.
  int64_t getInt(const std::string& n, int64_t dflt) const;
  float getFloat(const std::string& n, float dflt) const;
  std::string getString(const std::string& n, const std::string& dflt) const;
  std::vector<int64_t> getInts(const std::string& n, const std::vector<int64_t>& dflt = {}) const;

  const OpDef* def() const { return def_; }  // null for ops the registry does not know
  Graph* graph() const { return graph_; }

 private:
  friend class Graph;
  Node() = default;

  std::string op_, domain_, name_;
  std::vector<Value*> inputs_;
  std::vector<std::unique_ptr<Value>> results_;
  std::map<std::string, Attribute> attrs_;
  const OpDef* def_ = nullptr;
  Graph* graph_ = nullptr;
  std::list<std::unique_ptr<Node>>::iterator self_;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  std::string name = "main";
  int opset = 17;                              // default-domain opset
  std::map<std::string, int> domainOpsets;    // other domains the graph imports
  // The model's own list of trainable initializers (ONNX metadata key "ampc.trainable", written
  // by tools/export/ampc_export.py from named_parameters()); absent when the model has none.
  std::optional<std::vector<std::string>> declaredTrainable;
  // Embedding tables with a padding row (ONNX metadata key "ampc.embedding_padding", written by the
  // export helper from nn.Embedding's padding_idx, which no exporter keeps): initializer name ->
  // row. A lookup (Gather on axis 0) of such a table gives that row no gradient, as in PyTorch;
  // its other uses (a tied output projection) still do.
  std::map<std::string, int64_t> embeddingPadding;
  // BatchNormalizations kept in inference form on purpose (--batchnorm as-exported, or frozen
  // beside training-form ones), by their result's name (ONNX metadata key "ampc.frozen_batchnorms",
  // written on export): a re-import (a plan's step graph) keeps them so instead of training them.
  std::set<std::string> frozenBatchNorms;
  // What import changed from the model as written, one line each (ampc prints them).
  std::vector<std::string> importNotes;

  // Graph-level values, in order of creation within each kind.
  Value* addInput(const std::string& name, TensorType type);
  Value* addParam(const std::string& name, Tensor init);
  Value* addParamDecl(const std::string& name, TensorType type);  // no data (text form)
  Value* addConst(const std::string& name, Tensor data);
  Value* addConstDecl(const std::string& name, TensorType type);  // elided data (text form)
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& params() const { return params_; }
  const std::vector<Value*>& consts() const { return consts_; }
  // Removes an unused Param or Const.
  void eraseGraphValue(Value* v);

  // Creates a node before `before` (null: at the end). results: name and type of each result.
  Node* createNode(const std::string& op, const std::string& domain, const std::vector<Value*>& inputs,
                   const std::vector<std::pair<std::string, TensorType>>& results, Node* before = nullptr);
  // A node with n's op, domain, name and attributes (n may belong to another graph), on `inputs`,
  // with `results`, before `before` (null: at the end).
  Node* copyNode(const Node& n, const std::vector<Value*>& inputs, const std::vector<std::pair<std::string, TensorType>>& results,
                 Node* before = nullptr);
  // Removes a node whose results have no uses.
  void eraseNode(Node* n);
  // Reorders the nodes topologically, keeping the present order wherever it already is one (a
  // rewrite that put a node before a producer of its operands). Error on a cycle.
  void sortNodes();
  // Appends a result to a node (an optional output the model left out, e.g. Dropout's mask).
  Value* addResult(Node* n, const std::string& name, TensorType type);

  // Nodes in topological order.
  const std::list<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  // The node after n (n of this graph), null after the last: where a node that reads n's results goes.
  Node* nodeAfter(const Node* n) const;
  size_t numNodes() const { return nodes_.size(); }

  const std::vector<Value*>& outputs() const { return outputs_; }
  bool isOutput(const Value* v) const { return std::find(outputs_.begin(), outputs_.end(), v) != outputs_.end(); }
  void addOutput(Value* v) { outputs_.push_back(v); }
  void clearOutputs() { outputs_.clear(); }
  void setOutput(size_t i, Value* v) { outputs_[i] = v; }

  Value* lookup(const std::string& name) const;
  // Gives v a new name; Error if another value has it.
  void renameValue(Value* v, const std::string& name);
  // A name not used by any value: base, base_1, base_2, ...
  std::string uniqueName(const std::string& base) const;
  // Re-resolves each node's registry row (after import or parse).
  void bindOps();

 private:
  Value* addGraphValue(const std::string& name, TensorType type, ValueKind kind, std::vector<Value*>& list);
  void registerName(Value* v);

  std::vector<std::unique_ptr<Value>> owned_;  // graph-level values
  std::vector<Value*> inputs_, params_, consts_, outputs_;
  std::list<std::unique_ptr<Node>> nodes_;
  std::unordered_map<std::string, Value*> byName_;
};

// Checks the graph's invariants: unique names, operands defined before use, use lists that match
// the operands, outputs defined, and (with shapes) every node's result types equal to what the op
// registry infers. Throws Error naming the node.
void verify(const Graph& g, bool checkTypes = true);

}  // namespace ampc
