// The binding trace (tests/integration/bindings/reference.cpp) from C# over
// P/Invoke: what TorchSharp would call, with tensors from the test shim in
// place of TorchSharp's own. Writes the trace to $TORCHAMP_TRACE (else
// stdout), the checkpoints to $TORCHAMP_CHECKPOINT_DIR when set.
using System;
using System.Collections.Generic;
using System.IO;
using System.Runtime.InteropServices;
using System.Text;

static class Native {
  const string Lib = "torchamp_c";
  const string Shim = "torchamp_test_shim";

  [StructLayout(LayoutKind.Sequential)]
  public struct Entry {
    public IntPtr key;
    public int kind;
    public int reserved;
    public double f;
    public long i;
  }

  [StructLayout(LayoutKind.Sequential)]
  public struct ScalerOptions {
    public double init_scale, growth_factor, backoff_factor;
    public long growth_interval, backoff_interval;
    public double min_scale;
    public long max_consecutive_skips;
    public int enabled, dynamic, unscale_float16, reserved;
  }

  [StructLayout(LayoutKind.Sequential)]
  public struct SgdOptions {
    public double lr, momentum, dampening, weight_decay;
    public int nesterov, master_weights;
  }

  [DllImport(Lib)] public static extern IntPtr torchamp_last_error();
  [DllImport(Lib)] public static extern int torchamp_last_status();
  [DllImport(Lib)] public static extern int torchamp_abi_version();
  [DllImport(Lib)] public static extern int torchamp_state_entries(IntPtr state, out IntPtr entries, out UIntPtr count);
  [DllImport(Lib)] public static extern void torchamp_state_free(IntPtr state);
  [DllImport(Lib)] public static extern void torchamp_sgd_options_default(out SgdOptions options);
  [DllImport(Lib)] public static extern int torchamp_sgd_new(IntPtr[] parameters, UIntPtr count, ref SgdOptions options, out IntPtr optimizer);
  [DllImport(Lib)] public static extern void torchamp_optimizer_free(IntPtr optimizer);
  [DllImport(Lib)] public static extern int torchamp_optimizer_zero_grad(IntPtr optimizer, int set_to_none);
  [DllImport(Lib)] public static extern int torchamp_optimizer_save(IntPtr optimizer, string path);
  [DllImport(Lib)] public static extern void torchamp_scaler_options_default(out ScalerOptions options);
  [DllImport(Lib)] public static extern int torchamp_scaler_new(ref ScalerOptions options, out IntPtr scaler);
  [DllImport(Lib)] public static extern void torchamp_scaler_free(IntPtr scaler);
  [DllImport(Lib)] public static extern int torchamp_scaler_scale(IntPtr scaler, IntPtr output, out IntPtr scaled);
  [DllImport(Lib)] public static extern int torchamp_scaler_unscale_(IntPtr scaler, IntPtr optimizer);
  [DllImport(Lib)] public static extern int torchamp_scaler_step(IntPtr scaler, IntPtr optimizer, out int stepped);
  [DllImport(Lib)] public static extern int torchamp_scaler_update(IntPtr scaler);
  [DllImport(Lib)] public static extern int torchamp_scaler_get_scale(IntPtr scaler, out double scale);
  [DllImport(Lib)] public static extern int torchamp_scaler_state_dict(IntPtr scaler, out IntPtr state);
  [DllImport(Lib)] public static extern int torchamp_scaler_load_state_dict(IntPtr scaler, Entry[] entries, UIntPtr count);
  [DllImport(Lib)] public static extern int torchamp_scaler_save(IntPtr scaler, string path);
  [DllImport(Lib)] public static extern int torchamp_autocast_enter(int device_type, int dtype, int enabled, out IntPtr guard);
  [DllImport(Lib)] public static extern int torchamp_autocast_exit(IntPtr guard);
  [DllImport(Lib)] public static extern void torchamp_autocast_free(IntPtr guard);

  [DllImport(Shim)] public static extern void shim_manual_seed(ulong seed);
  [DllImport(Shim)] public static extern IntPtr shim_randn(long rows, long cols);
  [DllImport(Shim)] public static extern IntPtr shim_full(long rows, long cols, double value, int dtype, int requires_grad);
  [DllImport(Shim)] public static extern void shim_linear_init(long input, long output, out IntPtr weight, out IntPtr bias);
  [DllImport(Shim)] public static extern IntPtr shim_linear(IntPtr x, IntPtr weight, IntPtr bias);
  [DllImport(Shim)] public static extern IntPtr shim_mse_loss(IntPtr output, IntPtr y);
  [DllImport(Shim)] public static extern void shim_backward(IntPtr loss);
  [DllImport(Shim)] public static extern float shim_item(IntPtr scalar);
  [DllImport(Shim)] public static extern void shim_set_grad(IntPtr param, IntPtr grad);
  [DllImport(Shim)] public static extern double shim_clip_grad_norm(IntPtr[] parameters, UIntPtr count, double max_norm);
  [DllImport(Shim)] public static extern void shim_free(IntPtr tensor);
}

// A failed call's status and message.
class TorchampException : Exception {
  public readonly int Status;
  public TorchampException(int status, string message) : base(message) { Status = status; }
}

static class Quickstart {
  static readonly StringBuilder trace = new StringBuilder();

  static void Check(int status) {
    if (status != 0) throw new TorchampException(status, LastError());
  }
  static string LastError() { return Marshal.PtrToStringAnsi(Native.torchamp_last_error()); }
  static string Bits(float f) { return BitConverter.ToUInt32(BitConverter.GetBytes(f), 0).ToString("x8"); }
  static string Bits(double d) { return BitConverter.DoubleToInt64Bits(d).ToString("x16"); }
  static void Line(string s) { trace.Append(s).Append('\n'); }

  // A scaler's state dict as entries (keys copied into managed strings).
  static List<KeyValuePair<string, Native.Entry>> State(IntPtr scaler) {
    IntPtr state, entries;
    UIntPtr count;
    Check(Native.torchamp_scaler_state_dict(scaler, out state));
    var result = new List<KeyValuePair<string, Native.Entry>>();
    try {
      Check(Native.torchamp_state_entries(state, out entries, out count));
      int size = Marshal.SizeOf(typeof(Native.Entry));
      for (int k = 0; k < (int)count.ToUInt32(); ++k) {
        var e = (Native.Entry)Marshal.PtrToStructure(new IntPtr(entries.ToInt64() + k * size), typeof(Native.Entry));
        result.Add(new KeyValuePair<string, Native.Entry>(Marshal.PtrToStringAnsi(e.key), e));
      }
    } finally {
      Native.torchamp_state_free(state);
    }
    return result;
  }

  static string Render(string prefix, List<KeyValuePair<string, Native.Entry>> state) {
    var s = new StringBuilder();
    foreach (var kv in state) {
      var e = kv.Value;
      s.Append(prefix).Append(' ').Append(kv.Key).Append(' ').Append(e.kind).Append(' ')
       .Append(e.kind == 1 ? Bits(e.f) : e.i.ToString()).Append('\n');
    }
    return s.ToString();
  }

  // Loads entries (keys as managed strings) into a scaler.
  static int Load(IntPtr scaler, List<KeyValuePair<string, Native.Entry>> state) {
    var entries = new Native.Entry[state.Count];
    var keys = new IntPtr[state.Count];
    try {
      for (int k = 0; k < state.Count; ++k) {
        keys[k] = Marshal.StringToHGlobalAnsi(state[k].Key);
        entries[k] = state[k].Value;
        entries[k].key = keys[k];
      }
      return Native.torchamp_scaler_load_state_dict(scaler, entries, new UIntPtr((uint)entries.Length));
    } finally {
      foreach (var k in keys) Marshal.FreeHGlobal(k);
    }
  }

  static IntPtr weight, bias, optimizer;
  static IntPtr[] xs = new IntPtr[3], ys = new IntPtr[3];

  static void Iterate(int i, IntPtr scaler) {
    IntPtr guard, scaled;
    int stepped;
    double scale;
    Check(Native.torchamp_optimizer_zero_grad(optimizer, 1));
    Check(Native.torchamp_autocast_enter(0, -1, 1, out guard));
    IntPtr output = Native.shim_linear(xs[i % 3], weight, bias);
    Check(Native.torchamp_autocast_exit(guard));
    Native.torchamp_autocast_free(guard);
    IntPtr loss = Native.shim_mse_loss(output, ys[i % 3]);
    Check(Native.torchamp_scaler_scale(scaler, loss, out scaled));
    Native.shim_backward(scaled);
    Check(Native.torchamp_scaler_step(scaler, optimizer, out stepped));
    Check(Native.torchamp_scaler_update(scaler));
    Check(Native.torchamp_scaler_get_scale(scaler, out scale));
    Line("step " + i + " loss " + Bits(Native.shim_item(loss)) + " scale " + Bits(scale) + " stepped " + stepped);
    Native.shim_free(scaled);
    Native.shim_free(loss);
    Native.shim_free(output);
  }

  static void Backward(IntPtr scaler) {
    IntPtr scaled;
    Check(Native.torchamp_optimizer_zero_grad(optimizer, 1));
    IntPtr output = Native.shim_linear(xs[0], weight, bias);
    IntPtr loss = Native.shim_mse_loss(output, ys[0]);
    Check(Native.torchamp_scaler_scale(scaler, loss, out scaled));
    Native.shim_backward(scaled);
    Native.shim_free(scaled);
    Native.shim_free(loss);
    Native.shim_free(output);
  }

  // A call that must fail: its status and message, and whether the state held.
  static void ExpectError(string name, IntPtr scaler, Func<int> call) {
    string before = Render("", State(scaler));
    int status = call();
    if (status == 0 || status != Native.torchamp_last_status())
      throw new Exception(name + ": expected an error, got " + status);
    Line("error " + name + " " + status + " " + LastError());
    Line("unchanged " + (before == Render("", State(scaler)) ? 1 : 0));
  }

  static int Main() {
    if (Native.torchamp_abi_version() != 1) throw new Exception("ABI " + Native.torchamp_abi_version());
    Native.shim_manual_seed(0);
    Native.shim_linear_init(4, 1, out weight, out bias);
    var parameters = new IntPtr[] { weight, bias };
    Native.SgdOptions sgd;
    Native.torchamp_sgd_options_default(out sgd);
    sgd.lr = 0.01;
    Check(Native.torchamp_sgd_new(parameters, new UIntPtr(2), ref sgd, out optimizer));
    for (int i = 0; i < 3; ++i) {
      xs[i] = Native.shim_randn(8, 4);
      ys[i] = Native.shim_randn(8, 1);
    }

    Line("run quickstart");
    Native.ScalerOptions options;
    Native.torchamp_scaler_options_default(out options);
    IntPtr scaler;
    Check(Native.torchamp_scaler_new(ref options, out scaler));
    for (int i = 0; i < 3; ++i) Iterate(i, scaler);
    Backward(scaler);
    Check(Native.torchamp_scaler_unscale_(scaler, optimizer));
    double norm = Native.shim_clip_grad_norm(parameters, new UIntPtr(2), 1.0);
    int stepped;
    double scale;
    Check(Native.torchamp_scaler_step(scaler, optimizer, out stepped));
    Check(Native.torchamp_scaler_update(scaler));
    Check(Native.torchamp_scaler_get_scale(scaler, out scale));
    Line("clip norm " + Bits(norm) + " scale " + Bits(scale) + " stepped " + stepped);

    Line("run overflow");
    options.init_scale = Math.Pow(2, 127);
    options.growth_interval = 2;
    IntPtr overflow, loaded, fresh;
    Check(Native.torchamp_scaler_new(ref options, out overflow));
    for (int i = 0; i < 6; ++i) Iterate(i, overflow);
    var state = State(overflow);
    trace.Append(Render("state", state));
    Native.torchamp_scaler_options_default(out options);
    Check(Native.torchamp_scaler_new(ref options, out loaded));
    Check(Load(loaded, state));
    trace.Append(Render("loaded", State(loaded)));

    Line("errors");
    int ignored;
    int nullStatus = Native.torchamp_scaler_step(IntPtr.Zero, optimizer, out ignored);
    Line("error null_handle " + nullStatus + " " + LastError());

    IntPtr half = Native.shim_full(1, 2, 1.0, 5, 1);
    IntPtr halfGrad = Native.shim_full(1, 2, 1.0, 5, 0);
    Native.shim_set_grad(half, halfGrad);
    IntPtr halfOptimizer;
    Check(Native.torchamp_sgd_new(new IntPtr[] { half }, new UIntPtr(1), ref sgd, out halfOptimizer));
    Check(Native.torchamp_scaler_new(ref options, out fresh));
    ExpectError("float16_gradient", fresh, () => Native.torchamp_scaler_unscale_(fresh, halfOptimizer));

    Backward(overflow);
    Check(Native.torchamp_scaler_step(overflow, optimizer, out stepped));
    ExpectError("step_twice", overflow, () => Native.torchamp_scaler_step(overflow, optimizer, out ignored));
    Check(Native.torchamp_scaler_update(overflow));

    var garbled = State(overflow);
    for (int k = 0; k < garbled.Count; ++k) {
      if (garbled[k].Key == "scale") {
        var e = garbled[k].Value;
        e.f = -1.0;
        garbled[k] = new KeyValuePair<string, Native.Entry>("scale", e);
      }
    }
    ExpectError("garbled_state", overflow, () => Load(overflow, garbled));
    trace.Append(Render("final", State(overflow)));

    string dir = Environment.GetEnvironmentVariable("TORCHAMP_CHECKPOINT_DIR");
    if (dir != null) {
      Check(Native.torchamp_scaler_save(overflow, Path.Combine(dir, "scaler.pt")));
      Check(Native.torchamp_optimizer_save(optimizer, Path.Combine(dir, "optimizer.pt")));
    }
    string path = Environment.GetEnvironmentVariable("TORCHAMP_TRACE");
    if (path != null) File.WriteAllText(path, trace.ToString());
    else Console.Write(trace.ToString());

    Native.torchamp_optimizer_free(halfOptimizer);
    Native.shim_free(halfGrad);
    Native.shim_free(half);
    foreach (var s in new IntPtr[] { fresh, loaded, overflow, scaler }) Native.torchamp_scaler_free(s);
    Native.torchamp_optimizer_free(optimizer);
    for (int i = 0; i < 3; ++i) { Native.shim_free(xs[i]); Native.shim_free(ys[i]); }
    Native.shim_free(weight);
    Native.shim_free(bias);
    return 0;
  }
}
