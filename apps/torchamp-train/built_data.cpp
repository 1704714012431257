// The digits' path in the checkout that built this program (see
// torchamp_apps::built_data_path in support.h; no header: a trivial compile).
namespace torchamp_apps {
const char* built_data_path();
const char* built_data_path() {
  return TORCHAMP_TRAIN_DEFAULT_DATA;
}
}  // namespace torchamp_apps
