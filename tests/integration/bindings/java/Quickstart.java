// The binding trace (tests/integration/bindings/reference.cpp) from Java on
// the foreign-function API (Java 22+): what a JVM binding such as
// javacpp-presets' would call, with tensors from the test shim in place of
// its own. Writes the trace to $TORCHAMP_TRACE (else stdout), the
// checkpoints to $TORCHAMP_CHECKPOINT_DIR when set.
//
//   java --enable-native-access=ALL-UNNAMED Quickstart.java
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_DOUBLE;
import static java.lang.foreign.ValueLayout.JAVA_FLOAT;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SymbolLookup;
import java.lang.invoke.MethodHandle;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

public class Quickstart {
  static final Linker LINKER = Linker.nativeLinker();
  static final Arena ARENA = Arena.ofAuto();
  static final SymbolLookup ABI = SymbolLookup.libraryLookup("libtorchamp_c.so", Arena.global());
  static final SymbolLookup SHIM =
      SymbolLookup.libraryLookup("libtorchamp_test_shim.so", Arena.global());

  // Struct layouts of include/torchamp/c/torchamp.h, by offset.
  static final long ENTRY_SIZE = 32; // key, kind, reserved, f, i
  static final long SCALER_OPTIONS_SIZE = 72;
  static final long SGD_OPTIONS_SIZE = 40;

  static MethodHandle fn(SymbolLookup lib, String name, MemoryLayout result, MemoryLayout... args) {
    MemorySegment symbol = lib.find(name).orElseThrow(() -> new IllegalStateException(name));
    FunctionDescriptor d =
        result == null ? FunctionDescriptor.ofVoid(args) : FunctionDescriptor.of(result, args);
    return LINKER.downcallHandle(symbol, d);
  }

  static final MethodHandle lastError = fn(ABI, "torchamp_last_error", ADDRESS);
  static final MethodHandle lastStatus = fn(ABI, "torchamp_last_status", JAVA_INT);
  static final MethodHandle abiVersion = fn(ABI, "torchamp_abi_version", JAVA_INT);
  static final MethodHandle stateEntries =
      fn(ABI, "torchamp_state_entries", JAVA_INT, ADDRESS, ADDRESS, ADDRESS);
  static final MethodHandle stateFree = fn(ABI, "torchamp_state_free", null, ADDRESS);
  static final MethodHandle sgdOptionsDefault =
      fn(ABI, "torchamp_sgd_options_default", null, ADDRESS);
  static final MethodHandle sgdNew =
      fn(ABI, "torchamp_sgd_new", JAVA_INT, ADDRESS, JAVA_LONG, ADDRESS, ADDRESS);
  static final MethodHandle optimizerFree = fn(ABI, "torchamp_optimizer_free", null, ADDRESS);
  static final MethodHandle zeroGrad =
      fn(ABI, "torchamp_optimizer_zero_grad", JAVA_INT, ADDRESS, JAVA_INT);
  static final MethodHandle optimizerSave =
      fn(ABI, "torchamp_optimizer_save", JAVA_INT, ADDRESS, ADDRESS);
  static final MethodHandle scalerOptionsDefault =
      fn(ABI, "torchamp_scaler_options_default", null, ADDRESS);
  static final MethodHandle scalerNew = fn(ABI, "torchamp_scaler_new", JAVA_INT, ADDRESS, ADDRESS);
  static final MethodHandle scalerFree = fn(ABI, "torchamp_scaler_free", null, ADDRESS);
  static final MethodHandle scale =
      fn(ABI, "torchamp_scaler_scale", JAVA_INT, ADDRESS, ADDRESS, ADDRESS);
  static final MethodHandle unscale = fn(ABI, "torchamp_scaler_unscale_", JAVA_INT, ADDRESS, ADDRESS);
  static final MethodHandle step =
      fn(ABI, "torchamp_scaler_step", JAVA_INT, ADDRESS, ADDRESS, ADDRESS);
  static final MethodHandle update = fn(ABI, "torchamp_scaler_update", JAVA_INT, ADDRESS);
  static final MethodHandle getScale =
      fn(ABI, "torchamp_scaler_get_scale", JAVA_INT, ADDRESS, ADDRESS);
  static final MethodHandle stateDict =
      fn(ABI, "torchamp_scaler_state_dict", JAVA_INT, ADDRESS, ADDRESS);
  static final MethodHandle loadStateDict =
      fn(ABI, "torchamp_scaler_load_state_dict", JAVA_INT, ADDRESS, ADDRESS, JAVA_LONG);
  static final MethodHandle scalerSave = fn(ABI, "torchamp_scaler_save", JAVA_INT, ADDRESS, ADDRESS);
  static final MethodHandle autocastEnter =
      fn(ABI, "torchamp_autocast_enter", JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT, ADDRESS);
  static final MethodHandle autocastExit = fn(ABI, "torchamp_autocast_exit", JAVA_INT, ADDRESS);
  static final MethodHandle autocastFree = fn(ABI, "torchamp_autocast_free", null, ADDRESS);

  static final MethodHandle manualSeed = fn(SHIM, "shim_manual_seed", null, JAVA_LONG);
  static final MethodHandle randn = fn(SHIM, "shim_randn", ADDRESS, JAVA_LONG, JAVA_LONG);
  static final MethodHandle full =
      fn(SHIM, "shim_full", ADDRESS, JAVA_LONG, JAVA_LONG, JAVA_DOUBLE, JAVA_INT, JAVA_INT);
  static final MethodHandle linearInit =
      fn(SHIM, "shim_linear_init", null, JAVA_LONG, JAVA_LONG, ADDRESS, ADDRESS);
  static final MethodHandle linear = fn(SHIM, "shim_linear", ADDRESS, ADDRESS, ADDRESS, ADDRESS);
  static final MethodHandle mseLoss = fn(SHIM, "shim_mse_loss", ADDRESS, ADDRESS, ADDRESS);
  static final MethodHandle backward = fn(SHIM, "shim_backward", null, ADDRESS);
  static final MethodHandle item = fn(SHIM, "shim_item", JAVA_FLOAT, ADDRESS);
  static final MethodHandle setGrad = fn(SHIM, "shim_set_grad", null, ADDRESS, ADDRESS);
  static final MethodHandle clipGradNorm =
      fn(SHIM, "shim_clip_grad_norm", JAVA_DOUBLE, ADDRESS, JAVA_LONG, JAVA_DOUBLE);
  static final MethodHandle shimFree = fn(SHIM, "shim_free", null, ADDRESS);

  static final StringBuilder trace = new StringBuilder();

  static String cString(MemorySegment p) {
    return p.reinterpret(Long.MAX_VALUE).getString(0);
  }

  static String lastErrorText() throws Throwable {
    return cString((MemorySegment) lastError.invokeExact());
  }

  static void check(int status) throws Throwable {
    if (status != 0) {
      throw new IllegalStateException("status " + status + ": " + lastErrorText());
    }
  }

  static String bits(float f) {
    return String.format("%08x", Float.floatToRawIntBits(f));
  }

  static String bits(double d) {
    return String.format("%016x", Double.doubleToRawLongBits(d));
  }

  static void line(String s) {
    trace.append(s).append('\n');
  }

  static MemorySegment out() {
    return ARENA.allocate(ADDRESS);
  }

  // One state-dict entry, its key copied into a Java string.
  record Entry(String key, int kind, double f, long i) {
    String render() {
      return key + " " + kind + " " + (kind == 1 ? bits(f) : Long.toString(i));
    }
  }

  static List<Entry> state(MemorySegment scaler) throws Throwable {
    MemorySegment holder = out();
    check((int) stateDict.invokeExact(scaler, holder));
    MemorySegment st = holder.get(ADDRESS, 0);
    List<Entry> result = new ArrayList<>();
    try {
      MemorySegment entries = out();
      MemorySegment count = ARENA.allocate(JAVA_LONG);
      check((int) stateEntries.invokeExact(st, entries, count));
      long n = count.get(JAVA_LONG, 0);
      MemorySegment e = entries.get(ADDRESS, 0).reinterpret(n * ENTRY_SIZE);
      for (long k = 0; k < n; ++k) {
        long at = k * ENTRY_SIZE;
        result.add(
            new Entry(
                cString(e.get(ADDRESS, at)),
                e.get(JAVA_INT, at + 8),
                e.get(JAVA_DOUBLE, at + 16),
                e.get(JAVA_LONG, at + 24)));
      }
    } finally {
      stateFree.invokeExact(st);
    }
    return result;
  }

  static String render(String prefix, List<Entry> state) {
    StringBuilder s = new StringBuilder();
    for (Entry e : state) {
      s.append(prefix).append(' ').append(e.render()).append('\n');
    }
    return s.toString();
  }

  static int load(MemorySegment scaler, List<Entry> state) throws Throwable {
    try (Arena arena = Arena.ofConfined()) {
      MemorySegment entries = arena.allocate(ENTRY_SIZE * state.size(), 8);
      for (int k = 0; k < state.size(); ++k) {
        Entry e = state.get(k);
        long at = k * ENTRY_SIZE;
        entries.set(ADDRESS, at, arena.allocateFrom(e.key()));
        entries.set(JAVA_INT, at + 8, e.kind());
        entries.set(JAVA_INT, at + 12, 0);
        entries.set(JAVA_DOUBLE, at + 16, e.f());
        entries.set(JAVA_LONG, at + 24, e.i());
      }
      return (int) loadStateDict.invokeExact(scaler, entries, (long) state.size());
    }
  }

  static MemorySegment weight, bias, optimizer;
  static MemorySegment[] xs = new MemorySegment[3], ys = new MemorySegment[3];

  static void iterate(int i, MemorySegment scaler) throws Throwable {
    check((int) zeroGrad.invokeExact(optimizer, 1));
    MemorySegment g = out();
    check((int) autocastEnter.invokeExact(0, -1, 1, g));
    MemorySegment guard = g.get(ADDRESS, 0);
    MemorySegment output = (MemorySegment) linear.invokeExact(xs[i % 3], weight, bias);
    check((int) autocastExit.invokeExact(guard));
    autocastFree.invokeExact(guard);
    MemorySegment loss = (MemorySegment) mseLoss.invokeExact(output, ys[i % 3]);
    MemorySegment s = out();
    check((int) scale.invokeExact(scaler, loss, s));
    MemorySegment scaled = s.get(ADDRESS, 0);
    backward.invokeExact(scaled);
    MemorySegment stepped = ARENA.allocate(JAVA_INT);
    check((int) step.invokeExact(scaler, optimizer, stepped));
    check((int) update.invokeExact(scaler));
    MemorySegment sc = ARENA.allocate(JAVA_DOUBLE);
    check((int) getScale.invokeExact(scaler, sc));
    float l = (float) item.invokeExact(loss);
    line("step " + i + " loss " + bits(l) + " scale " + bits(sc.get(JAVA_DOUBLE, 0))
        + " stepped " + stepped.get(JAVA_INT, 0));
    shimFree.invokeExact(scaled);
    shimFree.invokeExact(loss);
    shimFree.invokeExact(output);
  }

  static void backwardFirst(MemorySegment scaler) throws Throwable {
    check((int) zeroGrad.invokeExact(optimizer, 1));
    MemorySegment output = (MemorySegment) linear.invokeExact(xs[0], weight, bias);
    MemorySegment loss = (MemorySegment) mseLoss.invokeExact(output, ys[0]);
    MemorySegment s = out();
    check((int) scale.invokeExact(scaler, loss, s));
    MemorySegment scaled = s.get(ADDRESS, 0);
    backward.invokeExact(scaled);
    shimFree.invokeExact(scaled);
    shimFree.invokeExact(loss);
    shimFree.invokeExact(output);
  }

  interface Call {
    int run() throws Throwable;
  }

  // A call that must fail: its status and message, and whether the state held.
  static void expectError(String name, MemorySegment scaler, Call call) throws Throwable {
    String before = render("", state(scaler));
    int status = call.run();
    if (status == 0 || status != (int) lastStatus.invokeExact()) {
      throw new IllegalStateException(name + ": expected an error, got " + status);
    }
    line("error " + name + " " + status + " " + lastErrorText());
    line("unchanged " + (before.equals(render("", state(scaler))) ? 1 : 0));
  }

  static MemorySegment newScaler(MemorySegment options) throws Throwable {
    MemorySegment s = out();
    check((int) scalerNew.invokeExact(options, s));
    return s.get(ADDRESS, 0);
  }

  public static void main(String[] args) throws Throwable {
    if ((int) abiVersion.invokeExact() != 1) {
      throw new IllegalStateException("ABI version");
    }
    manualSeed.invokeExact(0L);
    MemorySegment w = out(), b = out();
    linearInit.invokeExact(4L, 1L, w, b);
    weight = w.get(ADDRESS, 0);
    bias = b.get(ADDRESS, 0);
    MemorySegment params = ARENA.allocate(ADDRESS, 2);
    params.setAtIndex(ADDRESS, 0, weight);
    params.setAtIndex(ADDRESS, 1, bias);
    MemorySegment sgd = ARENA.allocate(SGD_OPTIONS_SIZE, 8);
    sgdOptionsDefault.invokeExact(sgd);
    sgd.set(JAVA_DOUBLE, 0, 0.01); // lr
    MemorySegment o = out();
    check((int) sgdNew.invokeExact(params, 2L, sgd, o));
    optimizer = o.get(ADDRESS, 0);
    for (int i = 0; i < 3; ++i) {
      xs[i] = (MemorySegment) randn.invokeExact(8L, 4L);
      ys[i] = (MemorySegment) randn.invokeExact(8L, 1L);
    }

    line("run quickstart");
    MemorySegment options = ARENA.allocate(SCALER_OPTIONS_SIZE, 8);
    scalerOptionsDefault.invokeExact(options);
    MemorySegment scaler = newScaler(options);
    for (int i = 0; i < 3; ++i) {
      iterate(i, scaler);
    }
    backwardFirst(scaler);
    check((int) unscale.invokeExact(scaler, optimizer));
    double norm = (double) clipGradNorm.invokeExact(params, 2L, 1.0);
    MemorySegment stepped = ARENA.allocate(JAVA_INT);
    check((int) step.invokeExact(scaler, optimizer, stepped));
    check((int) update.invokeExact(scaler));
    MemorySegment sc = ARENA.allocate(JAVA_DOUBLE);
    check((int) getScale.invokeExact(scaler, sc));
    line("clip norm " + bits(norm) + " scale " + bits(sc.get(JAVA_DOUBLE, 0)) + " stepped "
        + stepped.get(JAVA_INT, 0));

    line("run overflow");
    options.set(JAVA_DOUBLE, 0, Math.pow(2, 127)); // init_scale
    options.set(JAVA_LONG, 24, 2L); // growth_interval
    MemorySegment overflow = newScaler(options);
    for (int i = 0; i < 6; ++i) {
      iterate(i, overflow);
    }
    List<Entry> st = state(overflow);
    trace.append(render("state", st));
    scalerOptionsDefault.invokeExact(options);
    MemorySegment loaded = newScaler(options);
    check(load(loaded, st));
    trace.append(render("loaded", state(loaded)));

    line("errors");
    int nullStatus = (int) step.invokeExact(MemorySegment.NULL, optimizer, MemorySegment.NULL);
    line("error null_handle " + nullStatus + " " + lastErrorText());

    MemorySegment half = (MemorySegment) full.invokeExact(1L, 2L, 1.0, 5, 1);
    MemorySegment halfGrad = (MemorySegment) full.invokeExact(1L, 2L, 1.0, 5, 0);
    setGrad.invokeExact(half, halfGrad);
    MemorySegment halfParams = ARENA.allocate(ADDRESS, 1);
    halfParams.setAtIndex(ADDRESS, 0, half);
    check((int) sgdNew.invokeExact(halfParams, 1L, sgd, o));
    MemorySegment halfOptimizer = o.get(ADDRESS, 0);
    MemorySegment fresh = newScaler(options);
    expectError("float16_gradient", fresh, () -> (int) unscale.invokeExact(fresh, halfOptimizer));

    backwardFirst(overflow);
    check((int) step.invokeExact(overflow, optimizer, stepped));
    expectError(
        "step_twice",
        overflow,
        () -> (int) step.invokeExact(overflow, optimizer, MemorySegment.NULL));
    check((int) update.invokeExact(overflow));

    List<Entry> garbled = new ArrayList<>();
    for (Entry e : state(overflow)) {
      garbled.add(e.key().equals("scale") ? new Entry("scale", e.kind(), -1.0, e.i()) : e);
    }
    expectError("garbled_state", overflow, () -> load(overflow, garbled));
    trace.append(render("final", state(overflow)));

    String dir = System.getenv("TORCHAMP_CHECKPOINT_DIR");
    if (dir != null) {
      try (Arena arena = Arena.ofConfined()) {
        check((int) scalerSave.invokeExact(overflow, arena.allocateFrom(dir + "/scaler.pt")));
        check(
            (int) optimizerSave.invokeExact(optimizer, arena.allocateFrom(dir + "/optimizer.pt")));
      }
    }
    String path = System.getenv("TORCHAMP_TRACE");
    if (path != null) {
      Files.writeString(Path.of(path), trace.toString());
    } else {
      System.out.print(trace);
    }

    optimizerFree.invokeExact(halfOptimizer);
    shimFree.invokeExact(halfGrad);
    shimFree.invokeExact(half);
    for (MemorySegment s : new MemorySegment[] {fresh, loaded, overflow, scaler}) {
      scalerFree.invokeExact(s);
    }
    optimizerFree.invokeExact(optimizer);
    for (int i = 0; i < 3; ++i) {
      shimFree.invokeExact(xs[i]);
      shimFree.invokeExact(ys[i]);
    }
    shimFree.invokeExact(weight);
    shimFree.invokeExact(bias);
  }
}
