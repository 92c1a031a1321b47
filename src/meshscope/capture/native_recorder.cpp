// meshscope's dispatcher recorder in C++: the same BackendSelect kernel as capture/dispatch.py's
// Python one, without entering Python per call.
//
// A Python kernel costs every collective the dispatcher's boxing into Python objects, the GIL and
// a Python redispatch (measured: about 15 us per call on a 2-core CPU box, more on autograd's
// device threads). This kernel summarises the call's arguments into a flat record (numbers only:
// each tensor's bytes, dtype, rows and rank; lists of them; ints; the process group's name) in a
// process-wide buffer, then redispatches below BackendSelect. Python drains the buffer at its own
// pace (the trace's flusher) and decodes the summaries with the same decoders as the Python kernel,
// so there is one decoding of every c10d schema, in capture/dispatch.py.
//
// Context the kernel cannot know (step, optimizer, module) is set from Python as a small integer
// at each of the job's moves (`move`: capture/job_context.py numbers its states), whose time is noted
// here too, so that a move costs no Python object, and a drain of them one string
// (docs/trace.md, "Time"); whether the call is inside the autograd engine is asked of autograd here,
// on the calling thread, as the Python kernel does.
//
// Each call's completion: a c10d op returns its Work among its outputs (Ops.cpp, torch 2.13:
// `(Tensor[], Work)` or `Work`), and the kernel adds a callback to the Work's future, which notes
// (call id, time) in a second buffer (`completions`). The future completes when the backend finished
// the work: gloo, on its worker thread (`AsyncWork::finishWorkGloo`); NCCL, once the work is
// enqueued, with CUDA events standing for the GPU's completion, so on NCCL it is not the kernel's end
// (docs/trace.md, "Time").
//
// Each call's arrival on the GPU (NCCL): where the call's tensors are on a CUDA device, a timed CUDA
// event is recorded on the issuing thread's current stream before the op runs, so it completes when
// that stream reached the call: the point a slow kernel of the job delays, which the CPU's issue time,
// running ahead of the GPU, does not see. ProcessGroupNCCL's own stream waits for that point before
// its start event (ProcessGroupNCCL.cpp, torch 2.11, `syncStream` then `ncclStartEvent_`). The events
// are placed on the steady clock through a reference event: the first, recorded at the first such
// call and waited for there (its completion read on the CPU clock), and one per step mark after it,
// each event timed from its step's reference (a float of milliseconds stays fine-grained over one
// step, not over an hour). They are read once, at the rank's end (`gpu_arrivals`), never while the
// job runs: a query from another thread during a CUDA graph capture would break the capture. The
// generic `c10::Event` (c10/core/Event.h) dispatches to CUDA at run time, so this file compiles and
// loads on a CPU build of torch unchanged.
//
// A newcomer's first trace waits for this file's compilation, so it includes only what the kernel
// uses (native_build.py has the figures). Not <torch/extension.h> (all of ATen's operators and
// pybind11), nor the headers of the process group and of autograd's graph task, which pull in all
// of ATen's operators too (torch 2.13: ProcessGroup.hpp includes <ATen/ATen.h>, graph_task.h reaches
// <ATen/Functions.h> through input_buffer.h). The one function of each it calls is declared below,
// and the module is bound with Python's C API, not pybind11, whose templates alone cost more to
// compile than the kernel. Work.hpp, whose virtual getFuture it calls, includes <ATen/ATen.h> for
// at::Tensor and the future alone: native_build puts native_headers/ first on the include path,
// whose ATen/ATen.h is those two headers (4 s of CPU less, measured in native_build.py).

#include <Python.h>  // first, as Python's C API asks
#include <c10/core/Event.h>
#include <pybind11/pytypes.h>  // py::object, for toPyObject's declaration only
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/library.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <typeindex>
#include <typeinfo>
#include <vector>

// Declared as in torch 2.13's torch/csrc/autograd/graph_task.h (libtorch_cpu) and
// torch/csrc/jit/python/pybind_utils.h (libtorch_python): the cache is keyed by the torch release,
// and a changed signature fails the link, so the trace falls back to the Python kernel and says so.
namespace torch::autograd {
TORCH_API int get_current_graph_task_id();
}
namespace torch::jit {
TORCH_PYTHON_API pybind11::object toPyObject(c10::IValue ivalue);
}
namespace c10d {
class ProcessGroup;  // only named: the kernel tells its arguments apart by type, Python names the group
}

namespace {

// Argument summary tags (a record's `args` is a flat sequence of int64).
enum Tag : int64_t { NONE = 0, TENSOR = 1, TENSORS = 2, TENSOR_LISTS = 3, INT = 4, INTS = 5, GROUP = 6 };

constexpr int32_t MARK = -1, UNKNOWN = -2, UNSUMMARISED = -3;

struct Record {
  int64_t id;         // the call's number in this process (its completion names it)
  int32_t op;         // index into `names`, or MARK (a step mark), UNKNOWN, UNSUMMARISED
  int32_t context;    // the state number of the job's last move when the call was issued
  bool backward;      // inside the autograd engine
  bool main_thread;   // issued on the thread that installed the recorder
  int8_t cuda = -1;   // the CUDA device of its first tensor on one, else -1
  int64_t t_ns;       // steady clock (CLOCK_MONOTONIC, as Python's time.perf_counter)
  std::vector<int64_t> args;
  // The process groups among the args, named when drained: each group itself (its Object's one slot),
  // not the fresh Object that boxing wraps it in per call. Records holding those Objects until their
  // drain added 0.8-2 ms to a DDP step of 8 bucket all-reduces on a 2-core box, holding the groups
  // 0-0.35 ms (benchmarks/diag_native_ddp.py, torch 2.13).
  std::vector<c10::intrusive_ptr<torch::CustomClassHolder>> groups;
};

std::mutex mutex;
std::vector<Record> buffer;
std::vector<std::pair<int64_t, int64_t>> completed;  // (call id, steady-clock ns), under `mutex`
std::mutex moves_mutex;
std::vector<std::pair<int64_t, int32_t>> moves;  // (steady-clock ns, state number), under `moves_mutex`
std::vector<std::string> names;
std::vector<std::unique_ptr<torch::Library>> libraries;
std::atomic<bool> active{false};
std::atomic<int32_t> context{0};
std::atomic<int64_t> calls{0};
std::thread::id main_id;
// GPU arrivals (the file's header): every reference event and every call's event, under `gpu_mutex`
// (not `mutex`: the first reference is waited for, and completion callbacks must not wait with it).
std::mutex gpu_mutex;
struct GpuMark {
  int64_t id;
  size_t ref;  // the reference it is timed from: index in gpu_refs
  c10::Event event;
};
constexpr size_t GPU_MARKS_MAX = 1 << 20;  // a bound on what a long trace holds (about 100 MB of events)
std::vector<c10::Event> gpu_refs;
std::vector<GpuMark> gpu_marks;
int64_t gpu_ref0_ns = 0;  // the steady clock when the first reference completed
c10::DeviceIndex gpu_device = -1;
int64_t gpu_dropped = 0;  // calls past the bound, or on a second device, left without an arrival
thread_local bool busy = false;  // a call nested in a recorded one (coalesced -> plain) is not recorded again
const c10::DispatchKeySet after_backend_select(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect);

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const c10::TypePtr& group_type() {
  static const c10::TypePtr type = c10::getCustomClassType<c10::intrusive_ptr<c10d::ProcessGroup>>();
  return type;
}

const c10::TypePtr& work_type() {
  static const c10::TypePtr type = c10::getCustomClassType<c10::intrusive_ptr<c10d::Work>>();
  return type;
}

// The Work classes whose getFuture threw, as this thread found them: the base class's throws on every
// call (Work.cpp, "Work::getFuture not implemented"; gloo's reduce_scatter_tensor and send/recv works
// keep it, torch 2.13), and a C++ exception captures a backtrace: 15 of them per step were about half of
// what the trace added to bench_trace.py's FSDP2 x TP step (benchmarks/bench_instructions.py).
thread_local std::vector<std::type_index> without_future;

void complete(int64_t id) {
  const int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(mutex);
  completed.emplace_back(id, t);
}

// After the op returned: the Work among the stack's top `outputs` values gets a completion callback.
void watch(const torch::jit::Stack& stack, size_t outputs, int64_t id) {
  for (size_t i = stack.size() - std::min(outputs, stack.size()); i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (!v.isCustomClass() || v.type() != work_type()) continue;
    auto work = v.toCustomClass<c10d::Work>();  // its type was checked above
    if (!work) return;
    const std::type_index type(typeid(*work));
    if (std::find(without_future.begin(), without_future.end(), type) != without_future.end()) return;
    c10::intrusive_ptr<c10::ivalue::Future> future;
    try {
      future = work->getFuture();
    } catch (const std::exception&) {  // a backend whose Work has no future: its completion stays unknown
      without_future.push_back(type);
      return;
    }
    // NCCL leaves a work's future unset inside a coalescing block (ProcessGroupNCCL.cpp, torch 2.11).
    // The callback reads no value (`uses_future` false): on a CUDA future a callback that does runs after
    // a stream of the pool is made to wait for the work and every output is record_stream'ed on it
    // (ivalue_inl.h, invokeCallback, torch 2.13), by which the trace would change when the job's memory
    // may be reused. NCCL's future is complete at enqueue, so the callback runs at once, here.
    if (future) future->addCallback([id](c10::ivalue::Future&) { complete(id); }, /*uses_future=*/false);
    return;
  }
}

void summarise_tensor(const at::Tensor& t, Record& r) {
  auto& out = r.args;
  if (r.cuda < 0 && t.is_cuda()) r.cuda = static_cast<int8_t>(t.get_device());
  out.push_back(static_cast<int64_t>(t.nbytes()));
  out.push_back(static_cast<int64_t>(t.scalar_type()));
  out.push_back(t.dim() ? t.size(0) : 1);
  out.push_back(t.dim());
}

void summarise(const c10::IValue& v, Record& r) {
  auto& out = r.args;
  if (v.isTensor()) {
    out.push_back(TENSOR);
    summarise_tensor(v.toTensor(), r);
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    out.push_back(TENSORS);
    out.push_back(list.size());
    for (const at::Tensor& t : list) summarise_tensor(t, r);
  } else if (v.isIntList()) {  // before isList, which every list is
    auto list = v.toIntVector();
    out.push_back(INTS);
    out.push_back(list.size());
    out.insert(out.end(), list.begin(), list.end());
  } else if (v.isList()) {  // Tensor[][] (all_gather's outputs, reduce_scatter's inputs)
    auto outer = v.toListRef();
    out.push_back(TENSOR_LISTS);
    out.push_back(outer.size());
    for (const auto& inner : outer) {
      auto list = inner.toTensorList();
      out.push_back(list.size());
      for (const at::Tensor& t : list) summarise_tensor(t, r);
    }
  } else if (v.isInt()) {
    out.push_back(INT);
    out.push_back(v.toInt());
  } else if (v.isCustomClass() && v.type() == group_type()) {  // not ReduceOp, the other custom class
    out.push_back(GROUP);
    out.push_back(r.groups.size());
    r.groups.push_back(v.toObjectRef().getSlot(0).toCapsule());
  } else {
    out.push_back(NONE);
  }
}

c10::Stream current_stream(c10::DeviceIndex index) {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(c10::Device(c10::DeviceType::CUDA, index));
}

// The call reached the GPU where its stream passes this event.
void gpu_arrive(int64_t id, c10::DeviceIndex index) {
  std::lock_guard<std::mutex> lock(gpu_mutex);
  if (gpu_refs.empty()) {  // the first reference, waited for here: once per rank
    gpu_refs.emplace_back(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    gpu_refs.back().record(current_stream(index));
    gpu_refs.back().synchronize();
    gpu_ref0_ns = now_ns();
    gpu_device = index;
  }
  if (index != gpu_device || gpu_marks.size() >= GPU_MARKS_MAX) {
    ++gpu_dropped;
    return;
  }
  gpu_marks.push_back({id, gpu_refs.size() - 1, c10::Event(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT)});
  gpu_marks.back().event.record(current_stream(index));
}

void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keyset, torch::jit::Stack* stack) {
  if (!active.load(std::memory_order_relaxed) || busy || keyset.has(c10::DispatchKey::Meta)) {
    op.redispatchBoxed(keyset & after_backend_select, stack);
    return;
  }
  Record r;
  r.id = calls.fetch_add(1, std::memory_order_relaxed);
  r.t_ns = now_ns();
  r.context = context.load(std::memory_order_relaxed);
  r.backward = torch::autograd::get_current_graph_task_id() != -1;
  r.main_thread = std::this_thread::get_id() == main_id;
  const auto& schema_name = op.schema().name();
  r.op = UNKNOWN;  // names is fixed once installed: no lock
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == schema_name) { r.op = static_cast<int32_t>(i); break; }
  size_t n = op.schema().arguments().size();
  r.args.reserve(8 * n);
  try {
    for (size_t i = stack->size() - n; i < stack->size(); ++i) summarise((*stack)[i], r);
  } catch (const std::exception&) {  // never break the job because of its tracer: count it
    r.args.clear();
    r.groups.clear();
    r.op = UNSUMMARISED;
  }
  const int64_t id = r.id;
  if (r.cuda >= 0) {
    try {
      gpu_arrive(id, r.cuda);
    } catch (const std::exception&) {  // never break the job because of its tracer: count it
      std::lock_guard<std::mutex> lock(gpu_mutex);
      ++gpu_dropped;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    buffer.push_back(std::move(r));
  }
  busy = true;
  try {
    op.redispatchBoxed(keyset & after_backend_select, stack);
  } catch (...) {
    busy = false;
    throw;
  }
  busy = false;
  watch(*stack, op.schema().returns().size(), id);
}

// Register the kernel for each named c10d op ("allreduce_", ...) at BackendSelect.
void install(const std::vector<std::string>& ops) {
  if (!libraries.empty()) return;
  main_id = std::this_thread::get_id();
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "c10d", c10::DispatchKey::BackendSelect,
                                              __FILE__, __LINE__);
  for (const auto& name : ops) {
    names.push_back("c10d::" + name);
    lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
  }
  libraries.push_back(std::move(lib));
}

void uninstall() {
  libraries.clear();
  names.clear();
  active = false;
}

bool installed() { return !libraries.empty(); }
void set_active(bool on) { active = on; }
// One of the job's moves (capture/job_context.py): the calls after it are stamped with `state`; the
// move is noted while the recorder is active (its first state, set as it starts, is no move).
void move(int32_t state) {
  const int64_t t = now_ns();
  context.store(state, std::memory_order_relaxed);
  if (!active.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(moves_mutex);
  moves.emplace_back(t, state);
}

// A step mark, in order with the calls around it.
void mark(int64_t step) {
  Record r;
  r.id = -1;
  r.op = MARK;
  r.t_ns = now_ns();
  r.context = context.load(std::memory_order_relaxed);
  r.backward = false;
  r.main_thread = std::this_thread::get_id() == main_id;
  r.args.push_back(step);
  {
    std::lock_guard<std::mutex> lock(gpu_mutex);
    if (!gpu_refs.empty()) {  // this step's reference for the GPU arrivals after it
      try {
        c10::Event ref(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
        ref.record(current_stream(gpu_device));
        gpu_refs.push_back(std::move(ref));
      } catch (const std::exception&) {  // the calls after it are timed from the previous reference
      }
    }
  }
  std::lock_guard<std::mutex> lock(mutex);
  buffer.push_back(std::move(r));
}

// Every recorded call's arrival on the GPU as (call id, steady-clock seconds), and the number left
// without one, waiting up to `wait_s` for the GPU to pass the last events. Releases them all.
PyObject* gpu_arrivals(PyObject*, PyObject* wait) {
  const double wait_s = PyFloat_AsDouble(wait);
  if (wait_s == -1.0 && PyErr_Occurred()) return nullptr;
  std::vector<c10::Event> refs;
  std::vector<GpuMark> marks;
  int64_t dropped = 0, ref0_ns = 0;
  {
    std::lock_guard<std::mutex> lock(gpu_mutex);
    refs.swap(gpu_refs);
    marks.swap(gpu_marks);
    std::swap(dropped, gpu_dropped);
    ref0_ns = gpu_ref0_ns;
  }
  std::vector<std::pair<int64_t, double>> out;
  try {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
    Py_BEGIN_ALLOW_THREADS
    try {  // no exception may leave with the GIL released
      while (!marks.empty() && !marks.back().event.query() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } catch (const std::exception&) {  // each event is asked again below
    }
    Py_END_ALLOW_THREADS
    std::vector<double> from0(refs.size(), -1.0);  // each reference's ms after the first, once known
    for (auto& m : marks) {
      try {
        if (!m.event.query() || !refs[m.ref].query()) {
          ++dropped;
          continue;
        }
        if (from0[m.ref] < 0) from0[m.ref] = m.ref == 0 ? 0.0 : refs[0].elapsedTime(refs[m.ref]);
        const double ms = from0[m.ref] + refs[m.ref].elapsedTime(m.event);
        out.emplace_back(m.id, static_cast<double>(ref0_ns) * 1e-9 + ms * 1e-3);
      } catch (const std::exception&) {  // an event captured into a CUDA graph has no time of its own
        ++dropped;
      }
    }
  } catch (const std::exception& exc) {
    PyErr_SetString(PyExc_RuntimeError, exc.what());
    return nullptr;
  }
  PyObject* rows = PyList_New(out.size());
  for (size_t k = 0; rows != nullptr && k < out.size(); ++k) {
    PyObject* row = Py_BuildValue("(Ld)", static_cast<long long>(out[k].first), out[k].second);
    if (row == nullptr) Py_CLEAR(rows);
    else PyList_SET_ITEM(rows, k, row);
  }
  if (rows == nullptr) return nullptr;
  return Py_BuildValue("(NL)", rows, static_cast<long long>(dropped));
}

// The name of a process group (the one slot of the Object that boxes it: ivalue_inl.h's
// IValue(intrusive_ptr<T> custom_class), torch 2.13), asked of Python once per group and drain:
// ``ProcessGroup.unbox(obj).group_name`` of the ScriptObject a Python kernel receives for it.
PyObject* group_name(const c10::intrusive_ptr<torch::CustomClassHolder>& group,
                     std::vector<std::pair<void*, PyObject*>>& named) {
  void* pg = group.get();  // held by its record: not freed, so not reused, before this drain ends
  for (const auto& [seen, name] : named)
    if (seen == pg) return name;
  static PyObject* unbox = [] {  // kept for the process's life, as the module is
    PyObject* dist = PyImport_ImportModule("torch.distributed");
    PyObject* cls = dist ? PyObject_GetAttrString(dist, "ProcessGroup") : nullptr;
    PyObject* f = cls ? PyObject_GetAttrString(cls, "unbox") : nullptr;
    Py_XDECREF(cls);
    Py_XDECREF(dist);
    return f;
  }();
  if (unbox == nullptr) return nullptr;
  pybind11::object box;
  try {  // boxed as the dispatcher boxes it (ivalue_inl.h's IValue(intrusive_ptr<T> custom_class))
    auto object = c10::ivalue::Object::create(c10::StrongTypePtr(nullptr, group_type()), 1);
    object->setSlot(0, c10::IValue::make_capsule(group));
    box = torch::jit::toPyObject(c10::IValue(std::move(object)));
  } catch (const std::exception& exc) {  // no C++ exception may cross into Python
    PyErr_SetString(PyExc_RuntimeError, exc.what());
    return nullptr;
  }
  PyObject* own = PyObject_CallOneArg(unbox, box.ptr());
  PyObject* name = own ? PyObject_GetAttrString(own, "group_name") : nullptr;
  Py_XDECREF(own);
  if (name != nullptr) named.emplace_back(pg, name);
  return name;
}

// Every record since the last drain: (op, t in seconds, context, backward, main thread, flat args,
// group names, call id); capture/native.py rebuilds the arguments from the flat ints.
PyObject* drain(PyObject*, PyObject*) {
  std::vector<Record> taken;
  {
    std::lock_guard<std::mutex> lock(mutex);
    taken.swap(buffer);
  }
  std::vector<std::pair<void*, PyObject*>> named;
  PyObject* out = PyList_New(taken.size());
  for (size_t k = 0; out != nullptr && k < taken.size(); ++k) {
    const auto& r = taken[k];
    PyObject* args = PyTuple_New(r.args.size());
    PyObject* groups = PyList_New(r.groups.size());
    for (size_t i = 0; args != nullptr && i < r.args.size(); ++i)
      PyTuple_SET_ITEM(args, i, PyLong_FromLongLong(r.args[i]));
    for (size_t i = 0; groups != nullptr && i < r.groups.size(); ++i) {
      PyObject* name = group_name(r.groups[i], named);
      if (name == nullptr) Py_CLEAR(groups);
      else PyList_SET_ITEM(groups, i, Py_NewRef(name));
    }
    PyObject* row = args && groups ? Py_BuildValue("(idiOOOOL)", r.op, static_cast<double>(r.t_ns) * 1e-9, r.context,
                                                   r.backward ? Py_True : Py_False, r.main_thread ? Py_True : Py_False,
                                                   args, groups, static_cast<long long>(r.id))
                                   : nullptr;
    Py_XDECREF(args);
    Py_XDECREF(groups);
    if (row == nullptr) Py_CLEAR(out);
    else PyList_SET_ITEM(out, k, row);
  }
  for (const auto& [seen, name] : named) Py_DECREF(name);
  return out;
}

PyObject* dtype_of(PyObject*, PyObject* scalar_type) {
  long st = PyLong_AsLong(scalar_type);
  if (st == -1 && PyErr_Occurred()) return nullptr;
  return Py_NewRef(reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<at::ScalarType>(st))));
}

// -- a fatal signal: the calls so far written before the rank dies ------------------------------------
// A rank that dies in native code (abort() in a C++ kernel, a segfault in one that corrupted the heap)
// runs no Python again, so the flusher's last half second of calls was lost and the rank read as one
// that never communicated. The handler, installed for the signals that end a process with a core,
// wakes the trace's flusher through a pipe (write and poll are async-signal-safe: signal-safety(7)),
// waits at most `FATAL_WAIT_MS` for it to write the calls and the rank's end and answer on a second
// pipe, then puts back the handler it replaced (Python's faulthandler, which torch's elastic agent
// enables in its workers: elastic/multiprocessing/errors/error_handler.py, torch 2.13; or the
// default) and raises the signal again, so the process ends as it would have. The flusher can answer
// only if the dying thread does not hold the GIL (torch releases it around its ops, ctypes around
// foreign calls); otherwise the wait runs out, and the handler writes the rank's end itself, made
// ready in Python at `watch_fatal` (open, write and rename are async-signal-safe too): failed, with
// the signal as its exit and what was not flushed named as unknown.
// A second fatal signal (the flusher itself crashing on the corrupted heap) goes straight on.
constexpr int FATAL[] = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL};
constexpr int FATAL_WAIT_MS = 2000;
int fatal_wake = -1, fatal_ack = -1;
std::atomic<int> fatal_entered{0};
struct sigaction fatal_previous[NSIG];
std::string fatal_end_path, fatal_end_temp, fatal_end[NSIG];  // set before the handler is installed

void on_fatal(int sig, siginfo_t*, void*) {
  if (fatal_entered.fetch_add(1) == 0 && fatal_wake >= 0) {
    const unsigned char byte = static_cast<unsigned char>(sig);
    struct pollfd answer = {fatal_ack, POLLIN, 0};
    const bool answered = write(fatal_wake, &byte, 1) == 1 && poll(&answer, 1, FATAL_WAIT_MS) == 1;
    const std::string& end = fatal_end[sig];
    if (!answered && !end.empty()) {
      const int fd = open(fatal_end_temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        const bool whole = write(fd, end.data(), end.size()) == static_cast<ssize_t>(end.size());
        close(fd);
        if (whole) rename(fatal_end_temp.c_str(), fatal_end_path.c_str());
      }
    }
  }
  sigaction(sig, &fatal_previous[sig], nullptr);
  raise(sig);  // blocked in this handler: delivered to the previous one as this returns
}

// watch_fatal((wake fd, answer fd, end path, {signal: end record})): install the handler; the flusher
// reads the signal's number from the wake pipe and writes a byte to the answer pipe when it is done;
// where it does not, the handler writes the signal's end record to the end path.
PyObject* watch_fatal(PyObject*, PyObject* args) {
  int wake = -1, ack = -1;
  const char* path = nullptr;
  PyObject* ends = nullptr;
  if (!PyArg_ParseTuple(args, "iisO!", &wake, &ack, &path, &PyDict_Type, &ends)) return nullptr;
  for (int sig : FATAL) {
    PyObject* key = PyLong_FromLong(sig);
    PyObject* text = key != nullptr ? PyDict_GetItemWithError(ends, key) : nullptr;  // borrowed
    Py_XDECREF(key);
    const char* utf8 = text != nullptr ? PyUnicode_AsUTF8(text) : nullptr;
    if (PyErr_Occurred()) return nullptr;
    fatal_end[sig] = utf8 != nullptr ? utf8 : "";
  }
  fatal_end_path = path;
  fatal_end_temp = fatal_end_path + ".fatal";
  fatal_wake = wake;
  fatal_ack = ack;
  struct sigaction action = {};
  action.sa_sigaction = on_fatal;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (int sig : FATAL) {
    struct sigaction before = {};
    sigaction(sig, nullptr, &before);
    if (before.sa_sigaction != on_fatal) {  // installed once per process (the fork server's ranks fork it)
      fatal_previous[sig] = before;
      sigaction(sig, &action, nullptr);
    }
  }
  Py_RETURN_NONE;
}

// -- the module: thin wrappers of the functions above in Python's calling convention --------------
PyObject* py_install(PyObject*, PyObject* list) {
  PyObject* items = PySequence_Fast(list, "install takes a list of op names");
  if (items == nullptr) return nullptr;
  std::vector<std::string> ops;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); ++i) {
    const char* name = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(items, i));
    if (name == nullptr) break;
    ops.emplace_back(name);
  }
  Py_DECREF(items);
  if (PyErr_Occurred()) return nullptr;
  try {
    install(ops);
  } catch (const std::exception& exc) {  // an op this torch does not have
    PyErr_SetString(PyExc_RuntimeError, exc.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

// (call id, t in seconds) of every completion since the last call.
PyObject* completions(PyObject*, PyObject*) {
  std::vector<std::pair<int64_t, int64_t>> taken;
  {
    std::lock_guard<std::mutex> lock(mutex);
    taken.swap(completed);
  }
  PyObject* out = PyList_New(taken.size());
  for (size_t k = 0; out != nullptr && k < taken.size(); ++k) {
    PyObject* row = Py_BuildValue("(Ld)", static_cast<long long>(taken[k].first), static_cast<double>(taken[k].second) * 1e-9);
    if (row == nullptr) Py_CLEAR(out);
    else PyList_SET_ITEM(out, k, row);
  }
  return out;
}

// The moves since the last call as the flight log's "x" line holds them (trace/recording.py): (the
// first one's time in seconds, the microseconds of each after it and the state numbers, each joined
// by commas), or None.
PyObject* py_moves(PyObject*, PyObject*) {
  std::vector<std::pair<int64_t, int32_t>> taken;
  {
    std::lock_guard<std::mutex> lock(moves_mutex);
    taken.swap(moves);
    moves.reserve(taken.size());  // as many as last time: a step repeats its moves
  }
  if (taken.empty()) Py_RETURN_NONE;
  const int64_t t0 = taken.front().first;
  std::string after, states;
  after.reserve(taken.size() * 8);
  states.reserve(taken.size() * 3);
  for (const auto& [t, state] : taken) {
    if (!states.empty()) {
      after += ',';
      states += ',';
    }
    after += std::to_string((t - t0 + 500) / 1000);  // to the microsecond, rounded
    states += std::to_string(state);
  }
  PyObject* a = PyUnicode_FromStringAndSize(after.data(), static_cast<Py_ssize_t>(after.size()));
  PyObject* b = a ? PyUnicode_FromStringAndSize(states.data(), static_cast<Py_ssize_t>(states.size())) : nullptr;
  if (b == nullptr) {
    Py_XDECREF(a);
    return nullptr;
  }
  return Py_BuildValue("(dNN)", static_cast<double>(t0) * 1e-9, a, b);
}

PyObject* py_uninstall(PyObject*, PyObject*) {
  uninstall();
  Py_RETURN_NONE;
}

PyObject* py_installed(PyObject*, PyObject*) { return PyBool_FromLong(installed()); }

PyObject* py_set_active(PyObject*, PyObject* on) {
  set_active(PyObject_IsTrue(on) == 1);
  Py_RETURN_NONE;
}

PyObject* py_move(PyObject*, PyObject* state) {
  long v = PyLong_AsLong(state);
  if (v == -1 && PyErr_Occurred()) return nullptr;
  move(static_cast<int32_t>(v));
  Py_RETURN_NONE;
}

PyObject* py_mark(PyObject*, PyObject* step) {
  long long s = PyLong_AsLongLong(step);
  if (s == -1 && PyErr_Occurred()) return nullptr;
  mark(s);
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"install", py_install, METH_O, nullptr},
    {"uninstall", py_uninstall, METH_NOARGS, nullptr},
    {"installed", py_installed, METH_NOARGS, nullptr},
    {"set_active", py_set_active, METH_O, nullptr},
    {"move", py_move, METH_O, nullptr},
    {"moves", py_moves, METH_NOARGS, nullptr},
    {"mark", py_mark, METH_O, nullptr},
    {"drain", drain, METH_NOARGS, nullptr},
    {"completions", completions, METH_NOARGS, nullptr},
    {"gpu_arrivals", gpu_arrivals, METH_O, nullptr},
    {"dtype_of", dtype_of, METH_O, nullptr},
    {"watch_fatal", watch_fatal, METH_O, nullptr},
    {nullptr, nullptr, 0, nullptr}};
PyModuleDef module = {PyModuleDef_HEAD_INIT, "meshscope_native_recorder", nullptr, -1, methods,
                      nullptr, nullptr, nullptr, nullptr};

}  // namespace

// The name native_build.NAME loads (importlib calls PyInit_<module name>).
PyMODINIT_FUNC PyInit_meshscope_native_recorder() { return PyModule_Create(&module); }
