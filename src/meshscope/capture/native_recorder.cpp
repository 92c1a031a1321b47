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
// when it changes (`set_context`); whether the call is inside the autograd engine is asked of
// autograd here, on the calling thread, as the Python kernel does.

#include <torch/extension.h>
#include <torch/library.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/tensor_dtypes.h>
#include <torch/csrc/DynamicTypes.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

// Argument summary tags (a record's `args` is a flat sequence of int64).
enum Tag : int64_t { NONE = 0, TENSOR = 1, TENSORS = 2, TENSOR_LISTS = 3, INT = 4, INTS = 5, GROUP = 6 };

constexpr int32_t MARK = -1, UNKNOWN = -2, UNSUMMARISED = -3;

struct Record {
  int32_t op;         // index into `names`, or MARK (a step mark), UNKNOWN, UNSUMMARISED
  int32_t context;    // set_context's value when the call was issued
  bool backward;      // inside the autograd engine
  bool main_thread;   // issued on the thread that installed the recorder
  int64_t t_ns;       // steady clock (CLOCK_MONOTONIC, as Python's time.perf_counter)
  std::vector<int64_t> args;
  std::vector<std::string> groups;  // names of the process groups among the args
};

std::mutex mutex;
std::vector<Record> buffer;
std::vector<std::string> names;
std::vector<std::unique_ptr<torch::Library>> libraries;
std::atomic<bool> active{false};
std::atomic<int32_t> context{0};
std::thread::id main_id;
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

void summarise_tensor(const at::Tensor& t, std::vector<int64_t>& out) {
  out.push_back(static_cast<int64_t>(t.nbytes()));
  out.push_back(static_cast<int64_t>(t.scalar_type()));
  out.push_back(t.dim() ? t.size(0) : 1);
  out.push_back(t.dim());
}

void summarise(const c10::IValue& v, Record& r) {
  auto& out = r.args;
  if (v.isTensor()) {
    out.push_back(TENSOR);
    summarise_tensor(v.toTensor(), out);
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    out.push_back(TENSORS);
    out.push_back(list.size());
    for (const at::Tensor& t : list) summarise_tensor(t, out);
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
      for (const at::Tensor& t : list) summarise_tensor(t, out);
    }
  } else if (v.isInt()) {
    out.push_back(INT);
    out.push_back(v.toInt());
  } else if (v.isCustomClass() && v.type() == group_type()) {  // not ReduceOp, the other custom class
    auto pg = v.toCustomClass<c10d::ProcessGroup>();
    out.push_back(GROUP);
    out.push_back(r.groups.size());
    r.groups.push_back(pg->getGroupName());
  } else {
    out.push_back(NONE);
  }
}

void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keyset, torch::jit::Stack* stack) {
  if (!active.load(std::memory_order_relaxed) || busy || keyset.has(c10::DispatchKey::Meta)) {
    op.redispatchBoxed(keyset & after_backend_select, stack);
    return;
  }
  Record r;
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
void set_context(int32_t value) { context.store(value, std::memory_order_relaxed); }

// A step mark, in order with the calls around it.
void mark(int64_t step) {
  Record r;
  r.op = MARK;
  r.t_ns = now_ns();
  r.context = context.load(std::memory_order_relaxed);
  r.backward = false;
  r.main_thread = std::this_thread::get_id() == main_id;
  r.args.push_back(step);
  std::lock_guard<std::mutex> lock(mutex);
  buffer.push_back(std::move(r));
}

// Every record since the last drain: (op, t in seconds, context, backward, main thread, flat args,
// group names); capture/native.py rebuilds the arguments from the flat ints.
py::list drain() {
  std::vector<Record> taken;
  {
    std::lock_guard<std::mutex> lock(mutex);
    taken.swap(buffer);
  }
  py::list out;
  for (const auto& r : taken) {
    py::tuple args(r.args.size());
    for (size_t i = 0; i < r.args.size(); ++i) args[i] = py::int_(r.args[i]);
    py::list groups;
    for (const auto& g : r.groups) groups.append(py::str(g));
    out.append(py::make_tuple(r.op, static_cast<double>(r.t_ns) * 1e-9, r.context, r.backward, r.main_thread, args,
                              groups));
  }
  return out;
}

py::object dtype_of(int64_t scalar_type) {
  return py::reinterpret_borrow<py::object>(
      reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<at::ScalarType>(scalar_type))));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install);
  m.def("uninstall", &uninstall);
  m.def("installed", &installed);
  m.def("set_active", &set_active);
  m.def("set_context", &set_context);
  m.def("mark", &mark);
  m.def("drain", &drain);
  m.def("dtype_of", &dtype_of);
}
