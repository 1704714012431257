//! The binding trace (tests/integration/bindings/reference.cpp) from Rust:
//! written to $TORCHAMP_TRACE (else a file under the target folder), the
//! checkpoints to $TORCHAMP_CHECKPOINT_DIR when set.
use std::fmt::Write as _;
use std::ptr;

use torchamp::ffi::{self, Tensor};
use torchamp::{Autocast, GradScaler, Optimizer, StateDict, Value};

// The tensor shim: the stand-in for tch-rs's own tensor calls.
#[link(name = "torchamp_test_shim")]
extern "C" {
    fn shim_manual_seed(seed: u64);
    fn shim_randn(rows: i64, cols: i64) -> *mut Tensor;
    fn shim_full(rows: i64, cols: i64, value: f64, dtype: i32, requires_grad: i32) -> *mut Tensor;
    fn shim_linear_init(input: i64, output: i64, weight: *mut *mut Tensor, bias: *mut *mut Tensor);
    fn shim_linear(x: *const Tensor, weight: *const Tensor, bias: *const Tensor) -> *mut Tensor;
    fn shim_mse_loss(out: *const Tensor, y: *const Tensor) -> *mut Tensor;
    fn shim_backward(loss: *const Tensor);
    fn shim_item(scalar: *const Tensor) -> f32;
    fn shim_set_grad(param: *mut Tensor, grad: *const Tensor);
    fn shim_clip_grad_norm(params: *const *mut Tensor, count: usize, max_norm: f64) -> f64;
    fn shim_free(tensor: *mut Tensor);
}

fn print_state(trace: &mut String, prefix: &str, state: &StateDict) {
    for (key, value) in state {
        match *value {
            Value::Double(f) => writeln!(trace, "{} {} 1 {:016x}", prefix, key, f.to_bits()),
            Value::Int(i) => writeln!(trace, "{} {} 2 {}", prefix, key, i),
            Value::Bool(b) => writeln!(trace, "{} {} 3 {}", prefix, key, b as i32),
        }
        .unwrap();
    }
}

// The bits of a state dict (f64 compared by bits, as the trace does).
fn bits(state: &StateDict) -> Vec<(String, u64)> {
    state
        .iter()
        .map(|(k, v)| {
            let b = match *v {
                Value::Double(f) => f.to_bits(),
                Value::Int(i) => i as u64,
                Value::Bool(b) => b as u64,
            };
            (k.clone(), b)
        })
        .collect()
}

struct Model {
    weight: *mut Tensor,
    bias: *mut Tensor,
    data: Vec<(*mut Tensor, *mut Tensor)>,
    optimizer: Optimizer,
}

impl Model {
    fn new() -> Model {
        unsafe { shim_manual_seed(0) };
        let (mut weight, mut bias) = (ptr::null_mut(), ptr::null_mut());
        unsafe { shim_linear_init(4, 1, &mut weight, &mut bias) };
        let mut sgd = torchamp::sgd_options();
        sgd.lr = 0.01;
        let optimizer = Optimizer::sgd(&[weight, bias], &sgd).unwrap();
        let data = (0..3).map(|_| unsafe { (shim_randn(8, 4), shim_randn(8, 1)) }).collect();
        Model { weight, bias, data, optimizer }
    }

    // One iteration of the quickstart's loop.
    fn iterate(&mut self, trace: &mut String, i: usize, scaler: &mut GradScaler) {
        let (x, y) = self.data[i % 3];
        self.optimizer.zero_grad(true).unwrap();
        let mut guard = Autocast::new(ffi::DEVICE_CPU, ffi::DTYPE_DEFAULT, true).unwrap();
        let out = unsafe { shim_linear(x, self.weight, self.bias) };
        guard.exit().unwrap();
        let loss = unsafe { shim_mse_loss(out, y) };
        let scaled = scaler.scale(loss).unwrap();
        unsafe { shim_backward(scaled) };
        let stepped = scaler.step(&mut self.optimizer).unwrap();
        scaler.update().unwrap();
        writeln!(
            trace,
            "step {} loss {:08x} scale {:016x} stepped {}",
            i,
            unsafe { shim_item(loss) }.to_bits(),
            scaler.get_scale().unwrap().to_bits(),
            stepped as i32
        )
        .unwrap();
        unsafe {
            shim_free(scaled);
            shim_free(loss);
            shim_free(out);
        }
    }

    // Backward of the first batch's scaled loss, without autocast.
    fn backward(&mut self, scaler: &mut GradScaler) {
        let (x, y) = self.data[0];
        self.optimizer.zero_grad(true).unwrap();
        unsafe {
            let out = shim_linear(x, self.weight, self.bias);
            let loss = shim_mse_loss(out, y);
            let scaled = scaler.scale(loss).unwrap();
            shim_backward(scaled);
            shim_free(scaled);
            shim_free(loss);
            shim_free(out);
        }
    }
}

// Runs a call that must fail: its status and message, and whether the
// scaler's state is as before.
fn expect_error<F>(trace: &mut String, name: &str, scaler: &GradScaler, call: F)
where
    F: FnOnce() -> torchamp::Result<()>,
{
    let before = scaler.state_dict().unwrap();
    let error = call().expect_err(name);
    assert_eq!(error.status, unsafe { ffi::torchamp_last_status() });
    writeln!(trace, "error {} {} {}", name, error.status, error.message).unwrap();
    let unchanged = bits(&before) == bits(&scaler.state_dict().unwrap());
    assert!(unchanged, "{} changed the state", name);
    writeln!(trace, "unchanged {}", unchanged as i32).unwrap();
}

#[test]
fn quickstart_trace() {
    assert_eq!(unsafe { ffi::torchamp_abi_version() }, ffi::ABI_VERSION);
    assert_eq!(torchamp::version(), "0.1.0");
    let mut trace = String::new();
    let mut model = Model::new();

    trace.push_str("run quickstart\n");
    let mut scaler = GradScaler::new(&torchamp::scaler_options()).unwrap();
    for i in 0..3 {
        model.iterate(&mut trace, i, &mut scaler);
    }
    model.backward(&mut scaler);
    scaler.unscale_(&mut model.optimizer).unwrap();
    let params = [model.weight, model.bias];
    let norm = unsafe { shim_clip_grad_norm(params.as_ptr(), 2, 1.0) };
    let stepped = scaler.step(&mut model.optimizer).unwrap();
    scaler.update().unwrap();
    writeln!(
        trace,
        "clip norm {:016x} scale {:016x} stepped {}",
        norm.to_bits(),
        scaler.get_scale().unwrap().to_bits(),
        stepped as i32
    )
    .unwrap();

    trace.push_str("run overflow\n");
    let mut options = torchamp::scaler_options();
    options.init_scale = 2f64.powi(127);
    options.growth_interval = 2;
    let mut overflow = GradScaler::new(&options).unwrap();
    for i in 0..6 {
        model.iterate(&mut trace, i, &mut overflow);
    }
    let state = overflow.state_dict().unwrap();
    print_state(&mut trace, "state", &state);
    let mut loaded = GradScaler::new(&torchamp::scaler_options()).unwrap();
    loaded.load_state_dict(&state).unwrap();
    print_state(&mut trace, "loaded", &loaded.state_dict().unwrap());

    trace.push_str("errors\n");
    let status =
        unsafe { ffi::torchamp_scaler_step(ptr::null_mut(), model.optimizer.as_ptr(), ptr::null_mut()) };
    writeln!(trace, "error null_handle {} {}", status, torchamp::last_error()).unwrap();

    let half = unsafe { shim_full(1, 2, 1.0, ffi::DTYPE_FLOAT16, 1) };
    let half_grad = unsafe { shim_full(1, 2, 1.0, ffi::DTYPE_FLOAT16, 0) };
    unsafe { shim_set_grad(half, half_grad) };
    let mut sgd = torchamp::sgd_options();
    sgd.lr = 0.01;
    let mut half_optimizer = Optimizer::sgd(&[half], &sgd).unwrap();
    let mut fresh = GradScaler::new(&torchamp::scaler_options()).unwrap();
    let fresh_ptr = fresh.as_ptr();
    expect_error(&mut trace, "float16_gradient", &fresh, || {
        torchamp::check(unsafe { ffi::torchamp_scaler_unscale_(fresh_ptr, half_optimizer.as_ptr()) })
    });

    model.backward(&mut overflow);
    overflow.step(&mut model.optimizer).unwrap();
    let overflow_ptr = overflow.as_ptr();
    let optimizer_ptr = model.optimizer.as_ptr();
    expect_error(&mut trace, "step_twice", &overflow, || {
        torchamp::check(unsafe { ffi::torchamp_scaler_step(overflow_ptr, optimizer_ptr, ptr::null_mut()) })
    });
    overflow.update().unwrap();

    let mut garbled = overflow.state_dict().unwrap();
    for entry in garbled.iter_mut() {
        if entry.0 == "scale" {
            entry.1 = Value::Double(-1.0);
        }
    }
    let before = overflow.state_dict().unwrap();
    let error = overflow.load_state_dict(&garbled).expect_err("garbled_state");
    writeln!(trace, "error garbled_state {} {}", error.status, error.message).unwrap();
    let unchanged = bits(&before) == bits(&overflow.state_dict().unwrap());
    assert!(unchanged);
    writeln!(trace, "unchanged {}", unchanged as i32).unwrap();
    print_state(&mut trace, "final", &overflow.state_dict().unwrap());

    if let Ok(dir) = std::env::var("TORCHAMP_CHECKPOINT_DIR") {
        overflow.save(&format!("{}/scaler.pt", dir)).unwrap();
        model.optimizer.save(&format!("{}/optimizer.pt", dir)).unwrap();
    }
    let path = std::env::var("TORCHAMP_TRACE")
        .unwrap_or_else(|_| std::env::temp_dir().join("torchamp-rust-trace.txt").display().to_string());
    std::fs::write(&path, trace).unwrap();

    drop(half_optimizer);
    unsafe {
        shim_free(half_grad);
        shim_free(half);
        for (x, y) in model.data.drain(..) {
            shim_free(x);
            shim_free(y);
        }
        shim_free(model.weight);
        shim_free(model.bias);
    }
}

#[test]
fn disabled_scaler_has_an_empty_state_dict() {
    let mut options = torchamp::scaler_options();
    options.enabled = 0;
    let scaler = GradScaler::new(&options).unwrap();
    assert!(scaler.state_dict().unwrap().is_empty());
}
