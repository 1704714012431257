// Master weights through ATen ops (see aten_masters.h). The bit arithmetic is
// done in int32, whose ATen ops wrap as two's complement on every device.

#include "optim/aten_masters.h"

#include "compat/compat.h"  // foreach_copy_
#include "optim/flat_tensors.h"

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

std::pair<at::Tensor, at::Tensor> split_bf16_bits(const at::Tensor& master) {
  const at::Tensor bits = master.view(at::kInt);
  const at::Tensor low = at::bitwise_and(bits, 0xffff);
  // The high half, plus one where the low half reads negative as int16.
  const at::Tensor high = at::bitwise_right_shift(bits, 16)
                              .bitwise_and_(0xffff)
                              .add_(at::ge(low, 0x8000).to(at::kInt))
                              .bitwise_and_(0xffff);
  return {high.to(at::kShort), low.to(at::kShort)};
}

void AtenMasters::add(const at::Tensor& param, const at::Tensor& stored, const at::Tensor& grad) {
  const bool bf16 = param.scalar_type() == at::kBFloat16;
  Kind& kind = bf16 ? bf16_ : f16_;
  order_.emplace_back(bf16, kind.params.size());
  kind.params.push_back(param);
  kind.stored.push_back(stored);
  kind.grads.push_back(grad);
}

void AtenMasters::join() {
  for (Kind* kind : {&bf16_, &f16_}) {
    if (kind->params.empty()) {
      continue;
    }
    if (kind == &bf16_) {
      kind->flat_master = join_bf16_master(flat(kind->params), flat(kind->stored));
      kind->masters = pieces(kind->flat_master, kind->params);
    } else {
      kind->masters = kind->stored;
    }
    kind->grads32 = pieces(flat(kind->grads).to(at::kFloat), kind->grads);
  }
}

const at::Tensor& AtenMasters::master(size_t i) const {
  return kind(i).masters.at(order_[i].second);
}

const at::Tensor& AtenMasters::grad32(size_t i) const {
  return kind(i).grads32.at(order_[i].second);
}

void AtenMasters::write_back(bool unscaled) const {
  if (!bf16_.params.empty()) {
    const auto halves = split_bf16_bits(bf16_.flat_master);
    compat::foreach_copy_(as_short(bf16_.params), pieces(halves.first, bf16_.params));
    compat::foreach_copy_(bf16_.stored, pieces(halves.second, bf16_.stored));
  }
  if (!f16_.params.empty()) {
    compat::foreach_copy_(f16_.params, f16_.masters);  // rounded to nearest even
  }
  if (unscaled) {
    for (const Kind* kind : {&bf16_, &f16_}) {
      compat::foreach_copy_(kind->grads, kind->grads32);
    }
  }
}

}  // namespace optim
}  // namespace torchamp
