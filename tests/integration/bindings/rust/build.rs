// Where libtorchamp_c (and, for the tests, the tensor shim) lie: the
// folders in TORCHAMP_C_LIB_DIR and TORCHAMP_SHIM_LIB_DIR, else the linker's
// own search path (an installed torchamp).
fn main() {
    for var in ["TORCHAMP_C_LIB_DIR", "TORCHAMP_SHIM_LIB_DIR"] {
        println!("cargo:rerun-if-env-changed={}", var);
        if let Ok(dir) = std::env::var(var) {
            println!("cargo:rustc-link-search=native={}", dir);
        }
    }
}
