#include <charconv>
#include <cmath>
#include <limits>

#include "compiler/ir/text.h"

namespace ampc {
namespace {

class Parser {
 public:
  Parser(const std::string& text, const std::string& file) : s_(text), file_(file) {}

  std::unique_ptr<Graph> parse() {
    auto g = std::make_unique<Graph>();
    g_ = g.get();
    expectWord("graph");
    g->name = parseString();
    expectWord("opset");
    g->opset = static_cast<int>(parseInt());
    expect('{');
    while (!tryChar('}')) parseStatement();
    skipSpace();
    if (pos_ != s_.size()) fail("unexpected text after the graph");
    g->bindOps();
    return g;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') { ++line; col = 1; } else ++col;
    }
    throw Error(file_ + ":" + std::to_string(line) + ":" + std::to_string(col) + ": " + msg);
  }

  void skipSpace() {
    while (pos_ < s_.size()) {
      if (std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      else if (s_[pos_] == '#') while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;  // comment
      else break;
    }
  }
  bool tryChar(char c) {
    skipSpace();
    if (pos_ < s_.size() && s_[pos_] == c) { ++pos_; return true; }
    return false;
  }
  void expect(char c) {
    if (!tryChar(c)) fail(std::string("expected '") + c + "'");
  }
  char peek() {
    skipSpace();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  std::string word() {
    skipSpace();
    size_t b = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_' || s_[pos_] == '.' || s_[pos_] == ':'))
      ++pos_;
    return s_.substr(b, pos_ - b);
  }
  void expectWord(const char* w) {
    size_t at = pos_;
    if (word() != w) { pos_ = at; fail(std::string("expected '") + w + "'"); }
  }
  std::string parseString() {
    expect('"');
    std::string r;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      char ch = s_[pos_++];
      if (ch == '\\' && pos_ < s_.size()) {
        ch = s_[pos_++];
        if (ch == 'n') ch = '\n';
      }
      r += ch;
    }
    if (pos_ >= s_.size()) fail("unterminated string");
    ++pos_;
    return r;
  }
  std::string parseName() {  // after % or @
    if (peek() == '"') return parseString();
    size_t b = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || std::string_view("_.:/-").find(s_[pos_]) != std::string_view::npos))
      ++pos_;
    if (b == pos_) fail("expected a name");
    return s_.substr(b, pos_ - b);
  }
  std::string valueName() {
    expect('%');
    return parseName();
  }
  // A number token as text: [-+]digits[.digits][e[-+]digits] | inf | nan.
  std::string numberToken() {
    skipSpace();
    size_t b = pos_;
    if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) ++pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.' ||
                                ((s_[pos_] == '-' || s_[pos_] == '+') && (s_[pos_ - 1] == 'e' || s_[pos_ - 1] == 'E'))))
      ++pos_;
    if (b == pos_) fail("expected a number");
    return s_.substr(b, pos_ - b);
  }
  static bool isFloatToken(const std::string& t) { return t.find_first_of(".eEnN") != std::string::npos; }
  int64_t toInt(const std::string& t) {
    int64_t v;
    auto r = std::from_chars(t.data(), t.data() + t.size(), v);
    if (r.ec != std::errc() || r.ptr != t.data() + t.size()) fail("bad integer '" + t + "'");
    return v;
  }
  double toDouble(const std::string& t) {
    std::string u = t[0] == '+' ? t.substr(1) : t;
    double v;
    auto r = std::from_chars(u.data(), u.data() + u.size(), v);
    if (r.ec != std::errc() || r.ptr != u.data() + u.size()) fail("bad number '" + t + "'");
    return v;
  }
  float toFloat(const std::string& t) {
    std::string u = t[0] == '+' ? t.substr(1) : t;
    float v;
    auto r = std::from_chars(u.data(), u.data() + u.size(), v);
    if (r.ec != std::errc() || r.ptr != u.data() + u.size()) fail("bad number '" + t + "'");
    return v;
  }
  int64_t parseInt() { return toInt(numberToken()); }

  TensorType parseType() {
    skipSpace();
    size_t at = pos_;
    std::string w = word();
    auto dt = dtypeFromName(w);
    if (!dt) { pos_ = at; fail("unknown dtype '" + w + "'"); }
    TensorType t{*dt, {}};
    expect('[');
    if (!tryChar(']')) {
      do {
        int64_t d = parseInt();
        if (d < 0) fail("negative dimension");
        t.shape.push_back(d);
      } while (tryChar(','));
      expect(']');
    }
    if (!t.sizeFits()) fail("type " + t.str() + " has too many elements");
    return t;
  }
  Tensor parseTensorData(const TensorType& t) {
    // Each element takes at least one character: a type larger than the rest of the text cannot
    // be filled, and is refused before its bytes are allocated.
    if (t.numel() > static_cast<int64_t>(s_.size() - std::min(pos_, s_.size())))
      fail("the text holds fewer than the " + std::to_string(t.numel()) + " elements of " + t.str());
    Tensor r(t);
    expect('[');
    int64_t i = 0;
    if (!tryChar(']')) {
      do {
        std::string tok = numberToken();
        if (i >= r.numel()) fail("more elements than " + t.str() + " holds");
        if (isFloat(t.dtype)) r.setDouble(i, t.dtype == DType::f64 ? toDouble(tok) : static_cast<double>(toFloat(tok)));
        else r.setInt(i, toInt(tok));
        ++i;
      } while (tryChar(','));
      expect(']');
    }
    if (i != r.numel()) fail(std::to_string(i) + " elements for " + t.str());
    return r;
  }

  Attribute parseAttr() {
    char c = peek();
    if (c == '"') return parseString();
    if (c == '[') {
      ++pos_;
      if (tryChar(']')) {
        if (pos_ < s_.size() && s_[pos_] == 'f') { ++pos_; return std::vector<float>{}; }
        if (pos_ < s_.size() && s_[pos_] == 's') { ++pos_; return std::vector<std::string>{}; }
        return std::vector<int64_t>{};
      }
      if (peek() == '"') {
        std::vector<std::string> v;
        do v.push_back(parseString()); while (tryChar(','));
        expect(']');
        return v;
      }
      std::vector<std::string> toks;
      do toks.push_back(numberToken()); while (tryChar(','));
      expect(']');
      if (isFloatToken(toks[0])) {
        std::vector<float> v;
        for (auto& t : toks) v.push_back(toFloat(t));
        return v;
      }
      std::vector<int64_t> v;
      for (auto& t : toks) v.push_back(toInt(t));
      return v;
    }
    size_t at = pos_;
    if (std::isalpha(static_cast<unsigned char>(c))) {  // a tensor (dtype[shape] [data]) or inf/nan
      if (dtypeFromName(word())) {
        pos_ = at;
        TensorType t = parseType();
        return parseTensorData(t);
      }
    }
    pos_ = at;
    std::string tok = numberToken();
    if (isFloatToken(tok)) return toFloat(tok);
    return toInt(tok);
  }

  Value* use() {
    if (tryChar('_')) return nullptr;
    size_t at = pos_;
    std::string n = valueName();
    Value* v = g_->lookup(n);
    if (!v) { pos_ = at; fail("use of undefined value %" + n); }
    return v;
  }

  void parseStatement() {
    char c = peek();
    if (c == '%') return parseNode();
    size_t at = pos_;
    std::string kw = word();
    if (kw == "domain") {
      std::string d = parseString();
      g_->domainOpsets[d] = static_cast<int>(parseInt());
      return;
    }
    if (kw == "output") {
      g_->addOutput(use());
      if (!g_->outputs().back()) fail("an output cannot be omitted");
      return;
    }
    if (kw != "input" && kw != "param" && kw != "const") { pos_ = at; fail("expected input, param, const, output or a node"); }
    skipSpace();
    size_t nameAt = pos_;
    std::string name = valueName();
    if (g_->lookup(name)) { pos_ = nameAt; fail("value %" + name + " is defined twice"); }
    expect(':');
    TensorType t = parseType();
    if (kw == "input") g_->addInput(name, t);
    else if (kw == "param") g_->addParamDecl(name, t);
    else {
      expect('=');
      skipSpace();
      if (s_.compare(pos_, 3, "...") == 0) {
        pos_ += 3;
        g_->addConstDecl(name, t);
      } else {
        g_->addConst(name, parseTensorData(t));
      }
    }
  }

  void parseNode() {
    std::vector<std::pair<std::string, TensorType>> results;
    do {
      skipSpace();
      size_t at = pos_;
      std::string n = valueName();
      if (g_->lookup(n)) { pos_ = at; fail("value %" + n + " is defined twice"); }
      for (auto& r : results)
        if (r.first == n) { pos_ = at; fail("value %" + n + " is defined twice"); }
      expect(':');
      results.emplace_back(n, parseType());
    } while (tryChar(','));
    expect('=');
    std::string op = word();
    if (op.empty()) fail("expected an op name");
    std::string domain;
    if (auto k = op.rfind("::"); k != std::string::npos) {
      domain = op.substr(0, k);
      op = op.substr(k + 2);
    }
    expect('(');
    std::vector<Value*> ins;
    if (!tryChar(')')) {
      do ins.push_back(use()); while (tryChar(','));
      expect(')');
    }
    std::map<std::string, Attribute> attrs;
    if (tryChar('{')) {
      do {
        std::string k = word();
        if (k.empty()) fail("expected an attribute name");
        expect('=');
        attrs[k] = parseAttr();
      } while (tryChar(','));
      expect('}');
    }
    std::string name;
    if (tryChar('@')) name = parseName();
    Node* n = g_->createNode(op, domain, ins, results);
    n->setName(name);
    for (auto& [k, a] : attrs) n->setAttr(k, std::move(a));
  }

  const std::string& s_;
  std::string file_;
  size_t pos_ = 0;
  Graph* g_ = nullptr;
};

}  // namespace

std::unique_ptr<Graph> parseGraph(const std::string& text, const std::string& file) {
  return Parser(text, file).parse();
}

}  // namespace ampc
