// The corpus's path in the build folder that built this program, or "" (see
// torchamp_apps::built_data_path in support.h; no header: a trivial compile).
namespace torchamp_apps {
const char* built_data_path();
const char* built_data_path() {
  return TORCHAMP_GPT_DEFAULT_DATA;
}
}  // namespace torchamp_apps
