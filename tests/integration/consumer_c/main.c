/* Uses the C ABI as a binding's own code would, with no C++ in sight. */
#include <torchamp/c/torchamp.h>

#include <stdio.h>
#include <string.h>

int main(void) {
  torchamp_scaler_options options;
  torchamp_scaler* scaler;
  torchamp_state* state;
  const torchamp_entry* entries;
  size_t count;
  double scale;

  printf("torchamp %s, C ABI %d\n", torchamp_version(), torchamp_abi_version());
  if (torchamp_abi_version() != TORCHAMP_C_ABI_VERSION)
    return 1;
  torchamp_scaler_options_default(&options);
  options.growth_factor = 1.0;
  if (torchamp_scaler_new(&options, &scaler) != TORCHAMP_VALUE_ERROR ||
      strstr(torchamp_last_error(), "growth_factor") == NULL) {
    return 1;
  }
  printf("refused: %s\n", torchamp_last_error());
  if (torchamp_scaler_new(NULL, &scaler) != TORCHAMP_OK ||
      torchamp_scaler_update_to(scaler, 512.0) != TORCHAMP_OK ||
      torchamp_scaler_get_scale(scaler, &scale) != TORCHAMP_OK || scale != 512.0 ||
      torchamp_scaler_state_dict(scaler, &state) != TORCHAMP_OK ||
      torchamp_state_entries(state, &entries, &count) != TORCHAMP_OK || count == 0) {
    fprintf(stderr, "failed: %s\n", torchamp_last_error());
    return 1;
  }
  printf("%s = %g (%zu keys)\n", entries[0].key, entries[0].f, count);
  torchamp_state_free(state);
  torchamp_scaler_free(scaler);
  return 0;
}
