//! torchamp for Rust: the GradScaler, autocast and the fused optimizers over
//! torchamp's C ABI (`include/torchamp/c/torchamp.h`, `libtorchamp_c`).
//!
//! Tensors are `*mut ffi::Tensor`, which is an `at::Tensor*`: tch-rs's
//! `Tensor::as_ptr()` (cast) gives one. Every call returns `Result<_, Error>`;
//! an `Err` left the library's state as it was.

use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::c_char;
use std::ptr;

/// The C ABI's declarations, one for one (include/torchamp/c/torchamp.h).
pub mod ffi {
    use std::os::raw::c_char;

    pub type Status = i32;
    pub const OK: Status = 0;
    pub const KIND_DOUBLE: i32 = 1;
    pub const KIND_INT: i32 = 2;
    pub const KIND_BOOL: i32 = 3;
    pub const DEVICE_CPU: i32 = 0;
    pub const DEVICE_CUDA: i32 = 1;
    pub const DTYPE_DEFAULT: i32 = -1;
    pub const DTYPE_FLOAT16: i32 = 5;
    pub const DTYPE_BFLOAT16: i32 = 15;
    pub const ABI_VERSION: i32 = 1;

    #[repr(C)]
    pub struct Tensor {
        _opaque: [u8; 0],
    }
    #[repr(C)]
    pub struct Scaler {
        _opaque: [u8; 0],
    }
    #[repr(C)]
    pub struct Optimizer {
        _opaque: [u8; 0],
    }
    #[repr(C)]
    pub struct State {
        _opaque: [u8; 0],
    }
    #[repr(C)]
    pub struct Autocast {
        _opaque: [u8; 0],
    }
    #[repr(C)]
    pub struct ProcessGroup {
        _opaque: [u8; 0],
    }
    #[repr(C)]
    pub struct Ddp {
        _opaque: [u8; 0],
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct Entry {
        pub key: *const c_char,
        pub kind: i32,
        pub reserved: i32,
        pub f: f64,
        pub i: i64,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct ScalerOptions {
        pub init_scale: f64,
        pub growth_factor: f64,
        pub backoff_factor: f64,
        pub growth_interval: i64,
        pub backoff_interval: i64,
        pub min_scale: f64,
        pub max_consecutive_skips: i64,
        pub enabled: i32,
        pub dynamic: i32,
        pub unscale_float16: i32,
        pub reserved: i32,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct PaddleOptions {
        pub init_loss_scaling: f64,
        pub incr_ratio: f64,
        pub decr_ratio: f64,
        pub incr_every_n_steps: i64,
        pub decr_every_n_nan_or_inf: i64,
        pub enable: i32,
        pub use_dynamic_loss_scaling: i32,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct DdpOptions {
        pub bucket_cap_mb: f64,
        pub find_unused_parameters: i32,
        pub gradient_as_bucket_view: i32,
        pub average_gradients: i32,
        pub reserved: i32,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct SgdOptions {
        pub lr: f64,
        pub momentum: f64,
        pub dampening: f64,
        pub weight_decay: f64,
        pub nesterov: i32,
        pub master_weights: i32,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct AdamOptions {
        pub lr: f64,
        pub beta1: f64,
        pub beta2: f64,
        pub eps: f64,
        pub weight_decay: f64,
        pub amsgrad: i32,
        pub master_weights: i32,
    }

    #[link(name = "torchamp_c")]
    extern "C" {
        pub fn torchamp_last_error() -> *const c_char;
        pub fn torchamp_last_status() -> Status;
        pub fn torchamp_version() -> *const c_char;
        pub fn torchamp_abi_version() -> i32;
        pub fn torchamp_tensor_free(tensor: *mut Tensor);

        pub fn torchamp_state_entries(
            state: *const State,
            entries: *mut *const Entry,
            count: *mut usize,
        ) -> Status;
        pub fn torchamp_state_free(state: *mut State);

        pub fn torchamp_sgd_options_default(options: *mut SgdOptions);
        pub fn torchamp_adam_options_default(options: *mut AdamOptions);
        pub fn torchamp_adamw_options_default(options: *mut AdamOptions);
        pub fn torchamp_sgd_new(
            params: *const *mut Tensor,
            count: usize,
            options: *const SgdOptions,
            out: *mut *mut Optimizer,
        ) -> Status;
        pub fn torchamp_adam_new(
            params: *const *mut Tensor,
            count: usize,
            options: *const AdamOptions,
            out: *mut *mut Optimizer,
        ) -> Status;
        pub fn torchamp_adamw_new(
            params: *const *mut Tensor,
            count: usize,
            options: *const AdamOptions,
            out: *mut *mut Optimizer,
        ) -> Status;
        pub fn torchamp_optimizer_free(optimizer: *mut Optimizer);
        pub fn torchamp_optimizer_step(optimizer: *mut Optimizer) -> Status;
        pub fn torchamp_optimizer_zero_grad(optimizer: *mut Optimizer, set_to_none: i32) -> Status;
        pub fn torchamp_optimizer_save(optimizer: *const Optimizer, path: *const c_char) -> Status;
        pub fn torchamp_optimizer_load(optimizer: *mut Optimizer, path: *const c_char) -> Status;
        pub fn torchamp_optimizer_master_weight(
            optimizer: *const Optimizer,
            param: *const Tensor,
            out: *mut *mut Tensor,
        ) -> Status;

        pub fn torchamp_scaler_options_default(options: *mut ScalerOptions);
        pub fn torchamp_paddle_options_default(options: *mut PaddleOptions) -> Status;
        pub fn torchamp_scaler_new(options: *const ScalerOptions, out: *mut *mut Scaler) -> Status;
        pub fn torchamp_paddle_scaler_new(
            options: *const PaddleOptions,
            out: *mut *mut Scaler,
        ) -> Status;
        pub fn torchamp_scaler_free(scaler: *mut Scaler);
        pub fn torchamp_scaler_scale(
            scaler: *mut Scaler,
            output: *const Tensor,
            out: *mut *mut Tensor,
        ) -> Status;
        pub fn torchamp_scaler_unscale_(scaler: *mut Scaler, optimizer: *mut Optimizer) -> Status;
        pub fn torchamp_scaler_step(
            scaler: *mut Scaler,
            optimizer: *mut Optimizer,
            stepped: *mut i32,
        ) -> Status;
        pub fn torchamp_scaler_clip_grad_norm_(
            scaler: *mut Scaler,
            optimizer: *mut Optimizer,
            max_norm: f64,
            norm: *mut f64,
        ) -> Status;
        pub fn torchamp_scaler_update(scaler: *mut Scaler) -> Status;
        pub fn torchamp_scaler_update_to(scaler: *mut Scaler, new_scale: f64) -> Status;
        pub fn torchamp_scaler_get_scale(scaler: *const Scaler, scale: *mut f64) -> Status;
        pub fn torchamp_scaler_state_dict(scaler: *const Scaler, out: *mut *mut State) -> Status;
        pub fn torchamp_scaler_load_state_dict(
            scaler: *mut Scaler,
            entries: *const Entry,
            count: usize,
        ) -> Status;
        pub fn torchamp_scaler_save(scaler: *const Scaler, path: *const c_char) -> Status;
        pub fn torchamp_scaler_load(scaler: *mut Scaler, path: *const c_char) -> Status;

        pub fn torchamp_autocast_enter(
            device_type: i32,
            dtype: i32,
            enabled: i32,
            out: *mut *mut Autocast,
        ) -> Status;
        pub fn torchamp_autocast_exit(guard: *mut Autocast) -> Status;
        pub fn torchamp_autocast_free(guard: *mut Autocast);

        pub fn torchamp_init_process_group(
            backend: *const c_char,
            init_method: *const c_char,
            rank: i32,
            world_size: i32,
            out: *mut *mut ProcessGroup,
        ) -> Status;
        pub fn torchamp_process_group_rank(group: *const ProcessGroup, rank: *mut i32) -> Status;
        pub fn torchamp_process_group_size(group: *const ProcessGroup, size: *mut i32) -> Status;
        pub fn torchamp_process_group_free(group: *mut ProcessGroup);
        pub fn torchamp_destroy_process_group() -> Status;
        pub fn torchamp_scaler_set_process_group(scaler: *mut Scaler, group: *mut ProcessGroup) -> Status;
        pub fn torchamp_ddp_options_default(options: *mut DdpOptions);
        pub fn torchamp_ddp_new(
            group: *mut ProcessGroup,
            params: *const *mut Tensor,
            count: usize,
            options: *const DdpOptions,
            out: *mut *mut Ddp,
        ) -> Status;
        pub fn torchamp_ddp_prepare_backward(ddp: *mut Ddp, outputs: *const *mut Tensor, count: usize) -> Status;
        pub fn torchamp_ddp_free(ddp: *mut Ddp);
    }
}

/// A failed call: the C ABI's status (1 RuntimeError, 2 ValueError,
/// 3 TypeError, 4 NotImplementedError, 5 out of memory) and its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: i32,
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "torchamp error {}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// This thread's last error message.
pub fn last_error() -> String {
    unsafe { CStr::from_ptr(ffi::torchamp_last_error()) }.to_string_lossy().into_owned()
}

/// Turns a status into a Result.
pub fn check(status: ffi::Status) -> Result<()> {
    if status == ffi::OK {
        Ok(())
    } else {
        Err(Error { status, message: last_error() })
    }
}

fn c_string(what: &str, text: &str) -> Result<CString> {
    CString::new(text).map_err(|_| Error { status: 2, message: format!("{} {:?} holds a NUL", what, text) })
}

fn c_path(path: &str) -> Result<CString> {
    c_string("path", path)
}

/// The library's version ("0.1.0").
pub fn version() -> String {
    unsafe { CStr::from_ptr(ffi::torchamp_version()) }.to_string_lossy().into_owned()
}

/// One state-dict value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Double(f64),
    Int(i64),
    Bool(bool),
}

/// A state dict: PyTorch's keys (and torchamp's), in the library's order.
pub type StateDict = Vec<(String, Value)>;

/// `torchamp::optim::{SGD, Adam, AdamW}`.
pub struct Optimizer(*mut ffi::Optimizer);

impl Optimizer {
    pub fn sgd(params: &[*mut ffi::Tensor], options: &ffi::SgdOptions) -> Result<Self> {
        let mut out = ptr::null_mut();
        check(unsafe { ffi::torchamp_sgd_new(params.as_ptr(), params.len(), options, &mut out) })?;
        Ok(Optimizer(out))
    }
    pub fn adam(params: &[*mut ffi::Tensor], options: &ffi::AdamOptions) -> Result<Self> {
        let mut out = ptr::null_mut();
        check(unsafe { ffi::torchamp_adam_new(params.as_ptr(), params.len(), options, &mut out) })?;
        Ok(Optimizer(out))
    }
    pub fn adamw(params: &[*mut ffi::Tensor], options: &ffi::AdamOptions) -> Result<Self> {
        let mut out = ptr::null_mut();
        check(unsafe { ffi::torchamp_adamw_new(params.as_ptr(), params.len(), options, &mut out) })?;
        Ok(Optimizer(out))
    }
    pub fn as_ptr(&mut self) -> *mut ffi::Optimizer {
        self.0
    }
    pub fn step(&mut self) -> Result<()> {
        check(unsafe { ffi::torchamp_optimizer_step(self.0) })
    }
    pub fn zero_grad(&mut self, set_to_none: bool) -> Result<()> {
        check(unsafe { ffi::torchamp_optimizer_zero_grad(self.0, set_to_none as i32) })
    }
    /// LibTorch's format: `torch::load(optimizer, path)` reads it in C++.
    pub fn save(&self, path: &str) -> Result<()> {
        let p = c_path(path)?;
        check(unsafe { ffi::torchamp_optimizer_save(self.0, p.as_ptr()) })
    }
    pub fn load(&mut self, path: &str) -> Result<()> {
        let p = c_path(path)?;
        check(unsafe { ffi::torchamp_optimizer_load(self.0, p.as_ptr()) })
    }
}

impl Drop for Optimizer {
    fn drop(&mut self) {
        unsafe { ffi::torchamp_optimizer_free(self.0) }
    }
}

/// PyTorch's defaults for each optimizer's options.
pub fn sgd_options() -> ffi::SgdOptions {
    let mut o = ffi::SgdOptions::default();
    unsafe { ffi::torchamp_sgd_options_default(&mut o) };
    o
}
pub fn adam_options() -> ffi::AdamOptions {
    let mut o = ffi::AdamOptions::default();
    unsafe { ffi::torchamp_adam_options_default(&mut o) };
    o
}
pub fn adamw_options() -> ffi::AdamOptions {
    let mut o = ffi::AdamOptions::default();
    unsafe { ffi::torchamp_adamw_options_default(&mut o) };
    o
}
/// `torchamp::GradScalerOptions`'s defaults (PyTorch's).
pub fn scaler_options() -> ffi::ScalerOptions {
    let mut o = ffi::ScalerOptions::default();
    unsafe { ffi::torchamp_scaler_options_default(&mut o) };
    o
}

/// `torchamp::GradScaler`: Python's `torch.amp.GradScaler`.
pub struct GradScaler(*mut ffi::Scaler);

impl GradScaler {
    pub fn new(options: &ffi::ScalerOptions) -> Result<Self> {
        let mut out = ptr::null_mut();
        check(unsafe { ffi::torchamp_scaler_new(options, &mut out) })?;
        Ok(GradScaler(out))
    }
    pub fn as_ptr(&mut self) -> *mut ffi::Scaler {
        self.0
    }
    /// `output * scale`: a new tensor handle the caller frees.
    pub fn scale(&mut self, output: *const ffi::Tensor) -> Result<*mut ffi::Tensor> {
        let mut out = ptr::null_mut();
        check(unsafe { ffi::torchamp_scaler_scale(self.0, output, &mut out) })?;
        Ok(out)
    }
    pub fn unscale_(&mut self, optimizer: &mut Optimizer) -> Result<()> {
        check(unsafe { ffi::torchamp_scaler_unscale_(self.0, optimizer.0) })
    }
    /// Whether it stepped (false: skipped for an inf/NaN gradient).
    pub fn step(&mut self, optimizer: &mut Optimizer) -> Result<bool> {
        let mut stepped = 0;
        check(unsafe { ffi::torchamp_scaler_step(self.0, optimizer.0, &mut stepped) })?;
        Ok(stepped != 0)
    }
    pub fn update(&mut self) -> Result<()> {
        check(unsafe { ffi::torchamp_scaler_update(self.0) })
    }
    pub fn get_scale(&self) -> Result<f64> {
        let mut scale = 0.0;
        check(unsafe { ffi::torchamp_scaler_get_scale(self.0, &mut scale) })?;
        Ok(scale)
    }
    pub fn state_dict(&self) -> Result<StateDict> {
        let mut state = ptr::null_mut();
        check(unsafe { ffi::torchamp_scaler_state_dict(self.0, &mut state) })?;
        let mut entries: *const ffi::Entry = ptr::null();
        let mut count = 0usize;
        let listed = check(unsafe { ffi::torchamp_state_entries(state, &mut entries, &mut count) });
        let mut dict = StateDict::new();
        if listed.is_ok() && count > 0 {
            // (A disabled scaler's state is empty, and its entries pointer NULL.)
            for e in unsafe { std::slice::from_raw_parts(entries, count) } {
                let key = unsafe { CStr::from_ptr(e.key) }.to_string_lossy().into_owned();
                let value = match e.kind {
                    ffi::KIND_DOUBLE => Value::Double(e.f),
                    ffi::KIND_BOOL => Value::Bool(e.i != 0),
                    _ => Value::Int(e.i),
                };
                dict.push((key, value));
            }
        }
        unsafe { ffi::torchamp_state_free(state) };
        listed.map(|_| dict)
    }
    /// All or nothing: on an error nothing changed.
    pub fn load_state_dict(&mut self, dict: &[(String, Value)]) -> Result<()> {
        let keys = dict
            .iter()
            .map(|(k, _)| c_string("key", k))
            .collect::<Result<Vec<CString>>>()?;
        let entries: Vec<ffi::Entry> = dict
            .iter()
            .zip(keys.iter())
            .map(|((_, v), k)| {
                let (kind, f, i) = match *v {
                    Value::Double(f) => (ffi::KIND_DOUBLE, f, 0),
                    Value::Int(i) => (ffi::KIND_INT, 0.0, i),
                    Value::Bool(b) => (ffi::KIND_BOOL, 0.0, b as i64),
                };
                ffi::Entry { key: k.as_ptr() as *const c_char, kind, reserved: 0, f, i }
            })
            .collect();
        check(unsafe { ffi::torchamp_scaler_load_state_dict(self.0, entries.as_ptr(), entries.len()) })
    }
    /// Pickled: Python's `scaler.load_state_dict(torch.load(path))` reads it.
    pub fn save(&self, path: &str) -> Result<()> {
        let p = c_path(path)?;
        check(unsafe { ffi::torchamp_scaler_save(self.0, p.as_ptr()) })
    }
    pub fn load(&mut self, path: &str) -> Result<()> {
        let p = c_path(path)?;
        check(unsafe { ffi::torchamp_scaler_load(self.0, p.as_ptr()) })
    }
}

impl Drop for GradScaler {
    fn drop(&mut self) {
        unsafe { ffi::torchamp_scaler_free(self.0) }
    }
}

/// `torchamp::autocast`: the region lasts until `exit()` or the drop, on
/// this thread.
pub struct Autocast(*mut ffi::Autocast);

impl Autocast {
    pub fn new(device_type: i32, dtype: i32, enabled: bool) -> Result<Self> {
        let mut out = ptr::null_mut();
        check(unsafe { ffi::torchamp_autocast_enter(device_type, dtype, enabled as i32, &mut out) })?;
        Ok(Autocast(out))
    }
    pub fn exit(&mut self) -> Result<()> {
        check(unsafe { ffi::torchamp_autocast_exit(self.0) })
    }
}

impl Drop for Autocast {
    fn drop(&mut self) {
        unsafe { ffi::torchamp_autocast_free(self.0) }
    }
}
