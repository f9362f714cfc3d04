#include <charconv>

#include "compiler/ir/text.h"

namespace ampc {
namespace {

bool plainNameChar(char ch) {
  return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == ':' || ch == '/' || ch == '-';
}

std::string quote(const std::string& s) {
  std::string r = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') r += '\\';
    if (ch == '\n') { r += "\\n"; continue; }
    r += ch;
  }
  return r + '"';
}

std::string nameToken(const std::string& s) {
  bool plain = !s.empty();
  for (char ch : s) plain = plain && plainNameChar(ch);
  return plain ? s : quote(s);
}

template <typename F>
std::string shortest(F v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // keep floats distinguishable from ints
  return s;
}

std::string element(const Tensor& t, int64_t i) {
  switch (t.type.dtype) {
    case DType::f64: return shortest(t.getDouble(i));
    case DType::f32: case DType::f16: case DType::bf16: return shortest(static_cast<float>(t.getDouble(i)));
    default: return std::to_string(t.getInt(i));
  }
}

std::string tensorData(const Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.numel(); ++i) s += (i ? ", " : "") + element(t, i);
  return s + "]";
}

std::string attrText(const Attribute& a) {
  struct V {
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(float v) const { return shortest(v); }
    std::string operator()(const std::string& v) const { return quote(v); }
    std::string operator()(const std::vector<int64_t>& v) const {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    }
    std::string operator()(const std::vector<float>& v) const {
      if (v.empty()) return "[]f";
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + shortest(v[i]);
      return s + "]";
    }
    std::string operator()(const std::vector<std::string>& v) const {
      if (v.empty()) return "[]s";
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + quote(v[i]);
      return s + "]";
    }
    std::string operator()(const Tensor& t) const { return t.type.str() + " " + tensorData(t); }
  };
  return std::visit(V{}, a);
}

}  // namespace

std::string printGraph(const Graph& g) {
  std::string s = "graph " + quote(g.name) + " opset " + std::to_string(g.opset) + " {\n";
  for (const auto& [d, v] : g.domainOpsets) s += "  domain " + quote(d) + " " + std::to_string(v) + "\n";
  auto decl = [](const Value* v) { return "%" + nameToken(v->name()) + " : " + v->type().str(); };
  for (const Value* v : g.inputs()) s += "  input " + decl(v) + "\n";
  for (const Value* v : g.params()) s += "  param " + decl(v) + "\n";
  for (const Value* v : g.consts()) {
    const Tensor* t = v->data();
    s += "  const " + decl(v) + " = " + (t && t->numel() <= kMaxInlineElements ? tensorData(*t) : "...") + "\n";
  }
  for (const auto& n : g.nodes()) {
    s += "  ";
    for (size_t i = 0; i < n->numResults(); ++i) s += (i ? ", " : "") + decl(n->result(i));
    s += n->numResults() ? " = " : "";
    s += n->domain().empty() ? n->op() : n->domain() + "::" + n->op();
    s += "(";
    for (size_t i = 0; i < n->numInputs(); ++i) {
      const Value* v = n->input(i);
      s += (i ? ", " : "") + (v ? "%" + nameToken(v->name()) : std::string("_"));
    }
    s += ")";
    if (!n->attrs().empty()) {
      s += " {";
      bool first = true;
      for (const auto& [k, a] : n->attrs()) {
        s += (first ? "" : ", ") + k + " = " + attrText(a);
        first = false;
      }
      s += "}";
    }
    if (!n->name().empty()) s += " @" + nameToken(n->name());
    s += "\n";
  }
  for (const Value* v : g.outputs()) s += "  output %" + nameToken(v->name()) + "\n";
  return s + "}\n";
}

}  // namespace ampc
