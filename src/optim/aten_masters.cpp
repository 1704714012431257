// Master weights through ATen ops (see aten_masters.h). The bit arithmetic is
// done in int32, whose ATen ops wrap as two's complement on every device.

#include "optim/aten_masters.h"

#include <ATen/ops/bitwise_and.h>
#include <ATen/ops/bitwise_left_shift.h>
#include <ATen/ops/bitwise_right_shift.h>
#include <ATen/ops/ge.h>

namespace torchamp {
namespace optim {

at::Tensor join_bf16_master(const at::Tensor& param, const at::Tensor& remainder) {
  const at::Tensor high =
      at::bitwise_left_shift(param.view(at::kShort).to(at::kInt).bitwise_and_(0xffff), 16);
  return high.add_(remainder.to(at::kInt)).view(at::kFloat);
}

void split_bf16_master(const at::Tensor& master, const at::Tensor& param,
                       const at::Tensor& remainder) {
  const at::Tensor bits = master.view(at::kInt);
  const at::Tensor low = at::bitwise_and(bits, 0xffff);
  // The high half, plus one where the low half reads negative as int16.
  const at::Tensor high = at::bitwise_right_shift(bits, 16)
                              .bitwise_and_(0xffff)
                              .add_(at::ge(low, 0x8000).to(at::kInt))
                              .bitwise_and_(0xffff);
  param.view(at::kShort).copy_(high.to(at::kShort));
  remainder.copy_(low.to(at::kShort));
}

AtenMaster aten_master(const at::Tensor& param, const at::Tensor& stored, const at::Tensor& grad) {
  AtenMaster m{param, stored, at::Tensor(), grad, grad.to(at::kFloat)};
  m.master = param.scalar_type() == at::kBFloat16 ? join_bf16_master(param, stored) : stored;
  return m;
}

void write_back(const AtenMaster& m, bool unscaled) {
  if (m.param.scalar_type() == at::kBFloat16) {
    split_bf16_master(m.master, m.param, m.stored);
  } else {
    m.param.copy_(m.master);  // float16: the master rounded to nearest even
  }
  if (unscaled) {
    m.grad.copy_(m.grad32);
  }
}

}  // namespace optim
}  // namespace torchamp
