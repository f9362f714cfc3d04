// Element types of the IR and the exact f16/bf16 <-> f32 conversions every layer shares.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ampc {

// The IR's element types. fp8 (e4m3/e5m2) is reserved for later.
enum class DType : uint8_t { f64, f32, f16, bf16, i64, i32, i8, u8, boolean };

inline constexpr DType kAllDTypes[] = {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64,
                                       DType::i32, DType::i8,  DType::u8,  DType::boolean};

std::string_view dtypeName(DType t);                  // "f32", "bf16", "bool", ...
std::optional<DType> dtypeFromName(std::string_view);  // inverse of dtypeName
size_t dtypeSize(DType t);                            // bytes per element
bool isFloat(DType t);                                // f64 f32 f16 bf16
bool isLowFloat(DType t);                             // f16 bf16
bool isInteger(DType t);                              // i64 i32 i8 u8
double largestFinite(DType t);                        // a float type's largest finite value (f32's for others)

// ONNX TensorProto.DataType numbers <-> DType; nullopt for types the IR does not have.
std::optional<DType> dtypeFromOnnx(int onnxType);
int dtypeToOnnx(DType t);

// IEEE binary16 and bfloat16 <-> binary32. float->half/bf16 round to nearest even, keep the sign of
// zero, produce subnormals where needed, overflow to Inf, and keep NaN a (quiet) NaN.
uint16_t floatToHalf(float f);
float halfToFloat(uint16_t h);
uint16_t floatToBf16(float f);
float bf16ToFloat(uint16_t b);

}  // namespace ampc
