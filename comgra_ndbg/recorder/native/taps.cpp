// Gradient taps and parameter marks: the recorder's hooks on registered tensors' gradients and on tracked
// parameters, in C++.
//
// A Python hook costs a call into the interpreter for every registered tensor of every backward pass, plus a
// removable handle per registration. A tap is a pre-hook on the tensor's grad_fn that keeps the gradient
// (and its version counter) in a list; the first time in a backward pass it calls `on_start` (the recorder
// discovers the step's graph while the tensors saved for backward are still there) and asks the autograd
// engine to call `on_end` once the pass is over, where the recorder takes the whole list in one call. Taps
// armed in a step are removed from the nodes that outlive it by `reset()`, and a tap of an earlier step (its
// token) keeps nothing. Marks (below) note which parameters received a gradient. `pack`, the packed takes and
// `Layout` hand what the statistics kernels read (addresses and sizes of contiguous host arrays of one float
// dtype) to the recorder in one call, in place of a Python pass over the tensors per property.
#include <torch/extension.h>
#include <ATen/SavedTensorHooks.h>
#include <pybind11/numpy.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <typeindex>
#include <mutex>
#include <utility>
#include <vector>

namespace py = pybind11;
using torch::autograd::Node;
using torch::autograd::variable_list;

namespace {

constexpr int64_t kNotLean = -1;  // a tensor the kernels cannot read in place, or several dtypes
constexpr int64_t kNoRoom = -2;  // more tensors than the arrays hold

// The kernels' dtype code of a non-empty contiguous host tensor of float32 (0) or float64 (1), else kNotLean:
// what `stats.host.lean` accepts.
int64_t lean_code(const at::Tensor& t) {
  if (!t.defined() || t.layout() != at::kStrided || !t.device().is_cpu() || t.is_nested() || t.is_neg() ||
      t.is_conj() || t.numel() == 0 || !t.is_contiguous()) {
    return kNotLean;
  }
  if (t.scalar_type() == at::kFloat) return 0;
  if (t.scalar_type() == at::kDouble) return 1;
  return kNotLean;
}

// A writable C-contiguous one-dimensional int64 array's data (pybind11 would otherwise write into a converted copy).
int64_t* int64_data(py::array& array, const char* name) {
  if (!array.dtype().is(py::dtype::of<int64_t>()) || array.ndim() != 1 || !array.writeable() ||
      !(array.flags() & py::array::c_style)) {
    throw py::type_error(std::string(name) + " must be a writable C-contiguous int64 array");
  }
  return static_cast<int64_t*>(array.mutable_data());
}

// Fills `addresses` and `sizes` with the tensors' data pointers and element counts; returns their common dtype
// code, kNotLean or kNoRoom (the arrays are then partly written).
int64_t pack_into(const std::vector<at::Tensor>& tensors, py::array& addresses, py::array& sizes) {
  int64_t* address = int64_data(addresses, "addresses");
  int64_t* size = int64_data(sizes, "sizes");
  if (static_cast<size_t>(std::min(addresses.shape(0), sizes.shape(0))) < tensors.size()) return kNoRoom;
  int64_t code = tensors.empty() ? kNotLean : lean_code(tensors[0]);
  for (size_t i = 0; i < tensors.size() && code != kNotLean; ++i) {
    if (i > 0 && lean_code(tensors[i]) != code) return kNotLean;
    address[i] = reinterpret_cast<int64_t>(tensors[i].data_ptr());
    size[i] = tensors[i].numel();
  }
  return code;
}

struct State {
  std::mutex lock;  // backward passes of several threads may fire taps at once
  int64_t token = 0;
  bool queued = false;
  bool compiled = false;  // compiled autograd met a tap: it runs the pass without calling the hooks
  std::vector<int64_t> index;
  std::vector<at::Tensor> grads;
  std::vector<int64_t> versions;
  std::vector<int64_t> batches;  // the batch size of each kept gradient whose tensor is batched, else 0
  PyObject* on_start = nullptr;  // strong references, dropped by ~Taps under the GIL
  PyObject* on_end = nullptr;
};

void call(PyObject* callback) {
  if (callback == nullptr) return;
  Py_INCREF(callback);
  PyObject* result = PyObject_CallNoArgs(callback);
  if (result == nullptr) {
    PyErr_WriteUnraisable(callback);  // the recorder's own guard reports its problems: this never breaks the pass
  } else {
    Py_DECREF(result);
  }
  Py_DECREF(callback);
}

void end_of_backward(const std::weak_ptr<State>& weak) {
  auto state = weak.lock();
  if (!state) return;
  {
    std::lock_guard<std::mutex> guard(state->lock);
    state->queued = false;
    if (state->index.empty()) return;  // taken already, by a Python hook of the same pass (it flushes its own)
  }
  py::gil_scoped_acquire gil;
  call(state->on_end);
}

struct Tap : torch::autograd::FunctionPreHook {
  Tap(std::shared_ptr<State> state, int64_t token, int64_t index, uint32_t slot, bool batched)
      : state_(std::move(state)), token_(token), index_(index), slot_(slot), batched_(batched) {}

  variable_list operator()(const variable_list& grads) override {
    if (slot_ >= grads.size() || !grads[slot_].defined()) return grads;
    State* state = state_.get();
    bool queue = false;
    {
      std::lock_guard<std::mutex> guard(state->lock);
      if (token_ != state->token || state->on_end == nullptr) return grads;
      const at::Tensor& grad = grads[slot_];
      state->index.push_back(index_);
      state->grads.push_back(grad.requires_grad() ? grad.detach() : grad);
      state->versions.push_back(static_cast<int64_t>(grad._version()));
      state->batches.push_back(batched_ && grad.dim() >= 1 ? grad.size(0) : 0);
      if (!state->queued) {
        state->queued = true;
        queue = true;
      }
    }
    if (queue) {
      {
        py::gil_scoped_acquire gil;
        call(state->on_start);
      }
      std::weak_ptr<State> weak = state_;
      torch::autograd::Engine::get_default_engine().queue_callback([weak]() { end_of_backward(weak); });
    }
    return grads;
  }

  // Compiled autograd asks every hook to register itself with the graph it compiles; a tap stays out of that
  // graph (its pass records no gradient, which the recorder notes and answers with Python hooks from the
  // next step on) instead of failing the user's backward pass.
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) const override {
    std::lock_guard<std::mutex> guard(state_->lock);
    state_->compiled = true;
  }

 private:
  std::shared_ptr<State> state_;
  int64_t token_;
  int64_t index_;
  uint32_t slot_;
  bool batched_;
};

// Takes `hook` off `node`'s pre-hooks (where it still is).
void remove_pre_hook(Node& node, torch::autograd::FunctionPreHook* hook) {
  auto& hooks = node.pre_hooks();
  for (auto it = hooks.begin(); it != hooks.end(); ++it) {
    if (it->get() == hook) {
      hooks.erase(it);
      return;
    }
  }
}

// Pre-hooks armed on autograd nodes in a step, and taken off the nodes still alive when it ends (a graph the
// user keeps across steps outlives them): the taps' and the backward watch's.
class ArmedHooks {
 public:
  template <typename NodePointer>
  void arm(const NodePointer& node, std::unique_ptr<torch::autograd::FunctionPreHook> hook) {
    armed_.emplace_back(c10::weak_intrusive_ptr<Node>(node), hook.get());
    node->add_pre_hook(std::move(hook));
  }

  size_t size() const { return armed_.size(); }

  void remove_all() {
    for (auto& [weak, hook] : armed_) {
      auto node = weak.lock();
      if (!node) continue;
      remove_pre_hook(*node, hook);
    }
    armed_.clear();
  }

 private:
  std::vector<std::pair<c10::weak_intrusive_ptr<Node>, torch::autograd::FunctionPreHook*>> armed_;
};

class Taps {
 public:
  Taps(py::object on_start, py::object on_end) : state_(std::make_shared<State>()) {
    state_->on_start = on_start.release().ptr();
    state_->on_end = on_end.release().ptr();
  }

  ~Taps() {
    reset();
    PyObject *start, *end;
    {
      std::lock_guard<std::mutex> guard(state_->lock);
      start = state_->on_start;
      end = state_->on_end;
      state_->on_start = state_->on_end = nullptr;
    }
    Py_XDECREF(start);
    Py_XDECREF(end);
  }

  // Arms a tap on `tensor`'s grad_fn under `index` (`batched`: its dim 0 is the batch); false for a tensor
  // autograd did not produce (a leaf).
  bool tap(const at::Tensor& tensor, int64_t index, bool batched) {
    if (!tensor.defined() || !tensor.requires_grad()) return false;
    auto node = tensor.grad_fn();
    if (!node) return false;
    int64_t token;
    {
      std::lock_guard<std::mutex> guard(state_->lock);
      token = state_->token;
    }
    auto hook = std::make_unique<Tap>(state_, token, index, tensor.output_nr(), batched);
    armed_.arm(node, std::move(hook));
    return true;
  }

  // The gradients kept since the last take, in the order they arrived: (indices, gradients, versions).
  py::tuple take() {
    std::vector<int64_t> index, versions, batches;
    std::vector<at::Tensor> grads;
    swap_out(index, grads, versions, batches);
    return lists(index, grads, versions);
  }

  // `take`, plus the kernels' view of the gradients: when every one is unchanged since its tap (its version
  // counter) and a lean host array of one dtype (`lean_code`), their addresses, sizes and batch sizes fill the
  // arrays' first entries and the fourth item is that dtype's code; else kNotLean or kNoRoom.
  py::tuple take_packed(py::array addresses, py::array sizes, py::array batches) {
    std::vector<int64_t> index, versions, kept_batches;
    std::vector<at::Tensor> grads;
    swap_out(index, grads, versions, kept_batches);
    int64_t code = pack_into(grads, addresses, sizes);
    int64_t* batch = int64_data(batches, "batches");
    if (code >= 0 && static_cast<size_t>(batches.shape(0)) < grads.size()) code = kNoRoom;
    for (size_t i = 0; i < grads.size() && code >= 0; ++i) {
      if (static_cast<int64_t>(grads[i]._version()) != versions[i]) code = kNotLean;
      batch[i] = kept_batches[i];
    }
    py::tuple out = lists(index, grads, versions);
    return py::make_tuple(out[0], out[1], out[2], code);
  }

  size_t pending() {
    std::lock_guard<std::mutex> guard(state_->lock);
    return state_->index.size();
  }

  size_t armed() const { return armed_.size(); }

  // Whether compiled autograd ran a backward pass over a tap (see Tap::compiled_args).
  bool compiled() {
    std::lock_guard<std::mutex> guard(state_->lock);
    return state_->compiled;
  }

  // Ends the step: taps armed so far keep nothing more and leave the nodes still alive; kept gradients go.
  void reset() {
    {
      std::lock_guard<std::mutex> guard(state_->lock);
      state_->token += 1;
      state_->index.clear();
      state_->grads.clear();
      state_->versions.clear();
      state_->batches.clear();
    }
    armed_.remove_all();
  }

 private:
  void swap_out(std::vector<int64_t>& index, std::vector<at::Tensor>& grads, std::vector<int64_t>& versions,
                std::vector<int64_t>& batches) {
    std::lock_guard<std::mutex> guard(state_->lock);
    index.swap(state_->index);
    grads.swap(state_->grads);
    versions.swap(state_->versions);
    batches.swap(state_->batches);
  }

  static py::tuple lists(const std::vector<int64_t>& index, const std::vector<at::Tensor>& grads,
                         const std::vector<int64_t>& versions) {
    py::list out_index(index.size()), out_grads(grads.size()), out_versions(versions.size());
    for (size_t i = 0; i < index.size(); ++i) {
      out_index[i] = py::int_(index[i]);
      out_grads[i] = py::cast(grads[i]);
      out_versions[i] = py::int_(versions[i]);
    }
    return py::make_tuple(out_index, out_grads, out_versions);
  }

  std::shared_ptr<State> state_;
  ArmedHooks armed_;
};

// Which tracked parameters received a gradient since the last take, and after the step's first take what each
// backward pass adds to them (`incoming`): `ParameterTracker`'s marks. A mark is a pre-hook on the parameter's
// gradient accumulator, which the marks hold so that every graph reuses it (a tensor hook would be lost when
// Python adds the first hook of its own to the parameter, which clears the C++ ones).
struct MarkState {
  std::mutex lock;
  std::vector<uint8_t> fresh;
  std::vector<at::Tensor> incoming;
  bool per_pass = false;
  bool marked = false;
  bool compiled = false;
};

struct Mark : torch::autograd::FunctionPreHook {
  Mark(std::weak_ptr<MarkState> state, int64_t index) : state_(std::move(state)), index_(index) {}

  variable_list operator()(const variable_list& grads) override {
    auto state = state_.lock();
    if (!state || grads.empty() || !grads[0].defined()) return grads;
    std::lock_guard<std::mutex> guard(state->lock);
    state->fresh[index_] = 1;
    state->marked = true;
    if (state->per_pass) {  // a later gradient set: keep this pass's own gradient
      at::Tensor own = grads[0].detach();
      at::Tensor& kept = state->incoming[index_];
      kept = kept.defined() ? kept + own : own;
    }
    return grads;
  }

  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) const override {
    auto state = state_.lock();
    if (!state) return;
    std::lock_guard<std::mutex> guard(state->lock);
    state->compiled = true;
  }

 private:
  std::weak_ptr<MarkState> state_;
  int64_t index_;
};

class Marks {
 public:
  Marks() : state_(std::make_shared<MarkState>()) {}
  ~Marks() { unwatch(); }

  // Marks `parameter` (a leaf that requires grad) under `index`; false where it has no gradient accumulator.
  bool watch(const at::Tensor& parameter, int64_t index) {
    if (!parameter.defined() || !parameter.requires_grad() || parameter.grad_fn()) return false;
    auto accumulator = torch::autograd::impl::grad_accumulator(parameter);
    if (!accumulator) return false;
    {
      std::lock_guard<std::mutex> guard(state_->lock);
      if (static_cast<size_t>(index) >= state_->fresh.size()) {
        state_->fresh.resize(index + 1, 0);
        state_->incoming.resize(index + 1);
      }
    }
    if (static_cast<size_t>(index) >= parameters_.size()) parameters_.resize(index + 1);
    parameters_[index] = parameter;
    auto hook = std::make_unique<Mark>(state_, index);
    hooks_.emplace_back(accumulator, hook.get());
    accumulator->add_pre_hook(std::move(hook));
    return true;
  }

  void unwatch() {
    for (auto& [accumulator, hook] : hooks_) {
      remove_pre_hook(*accumulator, hook);
    }
    hooks_.clear();
    parameters_.clear();
  }

  // (indices of the fresh parameters, what later passes added to each or None) since the last take; from now
  // on the marks keep each pass's own gradient.
  py::tuple take() {
    std::vector<int64_t> fresh;
    std::vector<at::Tensor> incoming;
    {
      std::lock_guard<std::mutex> guard(state_->lock);
      state_->marked = false;
      for (size_t i = 0; i < state_->fresh.size(); ++i) {
        if (!state_->fresh[i]) continue;
        state_->fresh[i] = 0;
        fresh.push_back(static_cast<int64_t>(i));
        incoming.push_back(std::move(state_->incoming[i]));
        state_->incoming[i] = at::Tensor();
      }
      state_->per_pass = true;
    }
    py::list out_fresh(fresh.size()), out_incoming(fresh.size());
    for (size_t i = 0; i < fresh.size(); ++i) {
      out_fresh[i] = py::int_(fresh[i]);
      out_incoming[i] = incoming[i].defined() ? py::cast(incoming[i]) : py::none();
    }
    return py::make_tuple(out_fresh, out_incoming);
  }

  // The gradients `ParameterTracker.take_gradients` takes from the marks: (indices of the fresh parameters that
  // have one, those gradients, the kernels' dtype code): each parameter's `.grad` at the step's first take,
  // what later passes added to it after, detached. Where the code is a dtype's (>= 0) their addresses and sizes
  // fill the arrays' first entries, as `pack` fills them.
  py::tuple take_packed(py::array addresses, py::array sizes) {
    std::vector<int64_t> fresh;
    std::vector<at::Tensor> grads;
    {
      std::lock_guard<std::mutex> guard(state_->lock);
      bool first = !state_->per_pass;
      state_->marked = false;
      for (size_t i = 0; i < state_->fresh.size(); ++i) {
        if (!state_->fresh[i]) continue;
        state_->fresh[i] = 0;
        at::Tensor grad = first ? (i < parameters_.size() && parameters_[i].defined() ? parameters_[i].grad()
                                                                                      : at::Tensor())
                                : state_->incoming[i];
        state_->incoming[i] = at::Tensor();
        if (!grad.defined()) continue;
        fresh.push_back(static_cast<int64_t>(i));
        grads.push_back(grad.requires_grad() ? grad.detach() : grad);
      }
      state_->per_pass = true;
    }
    int64_t code = pack_into(grads, addresses, sizes);
    py::list out_fresh(fresh.size()), out_grads(grads.size());
    for (size_t i = 0; i < fresh.size(); ++i) {
      out_fresh[i] = py::int_(fresh[i]);
      out_grads[i] = py::cast(grads[i]);
    }
    return py::make_tuple(out_fresh, out_grads, code);
  }

  // A new step: nothing is fresh, and its first take reads `.grad`.
  void forget() {
    std::lock_guard<std::mutex> guard(state_->lock);
    std::fill(state_->fresh.begin(), state_->fresh.end(), 0);
    for (auto& kept : state_->incoming) kept = at::Tensor();
    state_->per_pass = state_->marked = false;
  }

  bool has_fresh() {
    std::lock_guard<std::mutex> guard(state_->lock);
    if (!state_->marked) return false;
    for (uint8_t flag : state_->fresh) {
      if (flag) return true;
    }
    return false;
  }

  // Whether compiled autograd ran a backward pass over a mark (see Tap::compiled_args).
  bool compiled() {
    std::lock_guard<std::mutex> guard(state_->lock);
    return state_->compiled;
  }

  size_t watched() const { return hooks_.size(); }

 private:
  std::shared_ptr<MarkState> state_;
  std::vector<std::pair<c10::intrusive_ptr<Node>, torch::autograd::FunctionPreHook*>> hooks_;
  std::vector<at::Tensor> parameters_;  // by index: whose `.grad` a step's first take reads
};

// `ParameterTracker.changed_gradients` of a polled tracker: which handed-over parameters' `.grad` is not the one
// read last (held weakly, so a freed gradient whose memory a new one reuses is never taken for it) or changed in
// place since (its version counter), read in one pass. Frozen parameters are passed over (what their `.grad`
// holds is left from before they were frozen).
class Polled {
 public:
  // Polls `parameter` under `index` (its position among the tracked parameters).
  void watch(const at::Tensor& parameter, int64_t index) {
    entries_.push_back(Entry{parameter, index, nothing(), -1, false});
  }

  size_t watched() const { return entries_.size(); }

  // A new step: nothing is read in it yet, and the gradients there now are not its own.
  void forget() {
    for (auto& e : entries_) {
      e.handed = false;
      remember(e, e.parameter.grad());
    }
  }

  // (indices, gradients detached, dtype code) of the changed ones, each remembered as read; `unread`: only of
  // those not read in this step yet; `force`: every one, changed or not. Addresses and sizes fill the arrays'
  // first entries as `pack` fills them.
  py::tuple changed(bool unread, bool force, py::array addresses, py::array sizes) {
    std::vector<int64_t> index;
    std::vector<at::Tensor> grads;
    for (auto& e : entries_) {
      if ((unread && e.handed) || !e.parameter.requires_grad()) continue;
      at::Tensor grad = e.parameter.grad();
      if (!grad.defined()) continue;
      if (!force && e.version == static_cast<int64_t>(grad._version()) &&
          e.seen.lock().get() == grad.unsafeGetTensorImpl()) {
        continue;
      }
      remember(e, grad);
      e.handed = true;
      index.push_back(e.index);
      grads.push_back(grad.requires_grad() ? grad.detach() : grad);
    }
    int64_t code = grads.empty() ? kNotLean : pack_into(grads, addresses, sizes);
    py::list out_index(index.size()), out_grads(grads.size());
    for (size_t i = 0; i < index.size(); ++i) {
      out_index[i] = py::int_(index[i]);
      out_grads[i] = py::cast(grads[i]);
    }
    return py::make_tuple(out_index, out_grads, code);
  }

 private:
  struct Entry {
    at::Tensor parameter;
    int64_t index;
    c10::weak_intrusive_ptr<c10::TensorImpl> seen;  // the `.grad` read last
    int64_t version;  // its version counter then
    bool handed;  // read in this step
  };

  static c10::weak_intrusive_ptr<c10::TensorImpl> nothing() {
    return c10::weak_intrusive_ptr<c10::TensorImpl>(c10::intrusive_ptr<c10::TensorImpl>());
  }

  static void remember(Entry& e, const at::Tensor& grad) {
    if (grad.defined()) {
      e.seen = c10::weak_intrusive_ptr<c10::TensorImpl>(grad.getIntrusivePtr());
      e.version = static_cast<int64_t>(grad._version());
    } else {
      e.seen = nothing();
      e.version = -1;
    }
  }

  std::vector<Entry> entries_;
};

// A registration plan's host view (`recorder/plan.py`): whether a tensor has the signature of the one the plan
// was made from (the same kind of autograd node, requires_grad, dtype, shape; a contiguous float32 or float64
// host tensor, no negative or conjugate view) and, when it has, the numpy array the kernels read, [batch or 1,
// units] over its memory, in one call in place of the plan's checks, `detach().numpy().reshape(...)`; for a
// contiguous integer or boolean tensor a float64 copy, the work view `plan.work_tensor` makes (the same values:
// integers below 2**53 are exact). A node defined in Python (a custom autograd Function) is told apart by its
// Python class, which this does not read: plans of such tensors get no view.
class HostView {
 public:
  HostView(const at::Tensor& example, int64_t batch)
      : requires_grad_(example.requires_grad()), dtype_(example.scalar_type()), node_type_(typeid(void)) {
    convert_ = example.defined() && at::isIntegralType(dtype_, /*includeBool=*/true) && example.device().is_cpu() &&
               example.layout() == at::kStrided && !example.is_nested() && example.numel() > 0 &&
               example.is_contiguous() && !example.is_neg();
    usable_ = convert_ || lean_code(example) >= 0;
    auto node = example.grad_fn();
    has_node_ = static_cast<bool>(node);
    if (node) {
      // (PyNode's type information is not exported by torch: its name, mangled or not, says which it is)
      usable_ = usable_ && std::strstr(typeid(*node).name(), "PyNode") == nullptr;
      node_type_ = std::type_index(typeid(*node));
    }
    sizes_ = example.sizes().vec();
    rows_ = batch > 0 ? batch : 1;
    units_ = usable_ ? example.numel() / rows_ : 0;
  }

  bool usable() const { return usable_; }

  py::object view(py::handle object) const {
    if (!usable_ || !THPVariable_Check(object.ptr())) return py::none();
    const at::Tensor& t = THPVariable_Unpack(object.ptr());
    if (!t.defined() || t.is_nested() || t.layout() != at::kStrided || !t.device().is_cpu() ||
        t.requires_grad() != requires_grad_ || t.scalar_type() != dtype_ || t.sizes() != c10::IntArrayRef(sizes_) ||
        !t.is_contiguous() || t.is_neg() || t.is_conj()) {
      return py::none();
    }
    auto node = t.grad_fn();
    if (static_cast<bool>(node) != has_node_ || (node && std::type_index(typeid(*node)) != node_type_)) {
      return py::none();
    }
    if (convert_) {
      py::array_t<double> out({static_cast<py::ssize_t>(rows_), static_cast<py::ssize_t>(units_)});
      double* target = out.mutable_data();
      int64_t count = rows_ * units_;
      AT_DISPATCH_INTEGRAL_TYPES_AND(at::kBool, dtype_, "host_view", [&] {
        const scalar_t* source = t.const_data_ptr<scalar_t>();
        for (int64_t i = 0; i < count; ++i) target[i] = static_cast<double>(source[i]);
      });
      return std::move(out);
    }
    auto item = static_cast<py::ssize_t>(t.element_size());
    py::dtype dtype = dtype_ == at::kFloat ? py::dtype::of<float>() : py::dtype::of<double>();
    return py::array(dtype, {static_cast<py::ssize_t>(rows_), static_cast<py::ssize_t>(units_)},
                     {static_cast<py::ssize_t>(units_) * item, item}, t.data_ptr(), object);
  }

 private:
  bool usable_ = false;
  bool convert_ = false;  // an integer or boolean tensor, read as a float64 copy
  bool has_node_ = false;
  bool requires_grad_;
  at::ScalarType dtype_;
  std::type_index node_type_;
  std::vector<int64_t> sizes_;
  int64_t rows_ = 1;
  int64_t units_ = 0;
};

// What must stay the same for addresses taken once to remain valid (`ParameterTracker`'s host layout): each
// tensor's storage address, shape, strides, dtype, device and negative-view bit, as `_layout_key` reads them.
class Layout {
 public:
  explicit Layout(const std::vector<at::Tensor>& tensors) {
    entries_.reserve(tensors.size());
    for (const auto& t : tensors) entries_.push_back(entry(t));
  }

  bool same(const std::vector<at::Tensor>& tensors) const {
    if (tensors.size() != entries_.size()) return false;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Entry& e = entries_[i];
      const at::Tensor& t = tensors[i];
      if (!t.defined() || t.layout() != at::kStrided || reinterpret_cast<int64_t>(t.data_ptr()) != e.address ||
          t.scalar_type() != e.dtype || t.device() != e.device || t.is_neg() != e.negative ||
          t.sizes() != c10::IntArrayRef(e.shape) || t.strides() != c10::IntArrayRef(e.strides)) {
        return false;
      }
    }
    return true;
  }

 private:
  struct Entry {
    int64_t address;
    std::vector<int64_t> shape, strides;
    at::ScalarType dtype;
    c10::Device device;
    bool negative;
  };

  static Entry entry(const at::Tensor& t) {
    if (!t.defined() || t.layout() != at::kStrided) throw py::value_error("Layout takes defined strided tensors");
    return Entry{reinterpret_cast<int64_t>(t.data_ptr()), t.sizes().vec(), t.strides().vec(), t.scalar_type(),
                 t.device(), t.is_neg()};
  }

  std::vector<Entry> entries_;
};

// `gradient_fingerprint` of NeuralDbg's step detection, `(ids, versions)`: which gradient tensor each parameter's
// `.grad` is (its TensorImpl; 0 for none) and its version counter (None for none). Equal fingerprints mean the
// same gradient tensors, unchanged. One pass instead of four per-parameter Python passes after every backward.
py::tuple grad_fingerprint(const std::vector<at::Tensor>& parameters) {
  py::tuple ids(parameters.size()), versions(parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor& grad = parameters[i].grad();
    ids[i] = py::int_(grad.defined() ? reinterpret_cast<int64_t>(grad.unsafeGetTensorImpl()) : 0);
    versions[i] = grad.defined() ? py::object(py::int_(static_cast<int64_t>(grad._version()))) : py::none();
  }
  return py::make_tuple(ids, versions);
}

// The sum of the tensors' version counters (what moves when any of them changes in place).
int64_t version_sum(const std::vector<at::Tensor>& tensors) {
  int64_t total = 0;
  for (const auto& t : tensors) total += static_cast<int64_t>(t._version());
  return total;
}

// The end of the backward passes through a model's output, for NeuralDbg's step detection (`instrument/steps.py`):
// a pre-hook on the output's grad_fn asks the engine, once per pass, to call `on_end` when the pass is over, in
// place of a Python hook registered (and removed) at every pass. Compiled autograd calls no C++ hook: it marks
// the watch as compiled, and NeuralDbg then reads the pass's end where its backward call returns.
struct WatchState {
  std::mutex lock;
  int64_t token = 0;
  bool queued = false;
  bool compiled = false;
  PyObject* on_end = nullptr;  // a strong reference, dropped by ~BackwardWatch under the GIL
};

void end_of_watched(const std::weak_ptr<WatchState>& weak) {
  auto state = weak.lock();
  if (!state) return;
  {
    std::lock_guard<std::mutex> guard(state->lock);
    state->queued = false;
  }
  py::gil_scoped_acquire gil;
  call(state->on_end);
}

struct WatchHook : torch::autograd::FunctionPreHook {
  WatchHook(std::shared_ptr<WatchState> state, int64_t token, uint32_t slot)
      : state_(std::move(state)), token_(token), slot_(slot) {}

  variable_list operator()(const variable_list& grads) override {
    if (slot_ >= grads.size() || !grads[slot_].defined()) return grads;
    {
      std::lock_guard<std::mutex> guard(state_->lock);
      if (token_ != state_->token || state_->on_end == nullptr || state_->queued) return grads;
      state_->queued = true;
    }
    std::weak_ptr<WatchState> weak = state_;
    torch::autograd::Engine::get_default_engine().queue_callback([weak]() { end_of_watched(weak); });
    return grads;
  }

  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) const override {
    std::lock_guard<std::mutex> guard(state_->lock);
    state_->compiled = true;
  }

 private:
  std::shared_ptr<WatchState> state_;
  int64_t token_;
  uint32_t slot_;
};

class BackwardWatch {
 public:
  explicit BackwardWatch(py::object on_end) : state_(std::make_shared<WatchState>()) {
    state_->on_end = on_end.release().ptr();
  }

  ~BackwardWatch() {
    reset();
    PyObject* end;
    {
      std::lock_guard<std::mutex> guard(state_->lock);
      end = state_->on_end;
      state_->on_end = nullptr;
    }
    Py_XDECREF(end);
  }

  // Watches the backward passes through `tensor` (a new forward pass's output: a pass left unfinished by an
  // error does not hold the next one back); false for a tensor autograd did not produce.
  bool arm(const at::Tensor& tensor) {
    if (!tensor.defined() || !tensor.requires_grad()) return false;
    auto node = tensor.grad_fn();
    if (!node) return false;
    int64_t token;
    {
      std::lock_guard<std::mutex> guard(state_->lock);
      token = state_->token;
      state_->queued = false;
    }
    auto hook = std::make_unique<WatchHook>(state_, token, tensor.output_nr());
    armed_.arm(node, std::move(hook));
    return true;
  }

  // Whether compiled autograd met a hook of the watch since the last call (and so called none of them).
  bool take_compiled() {
    std::lock_guard<std::mutex> guard(state_->lock);
    bool compiled = state_->compiled;
    state_->compiled = false;
    return compiled;
  }

  // Ends the step: the hooks leave the nodes still alive, and those that stay keep quiet.
  void reset() {
    {
      std::lock_guard<std::mutex> guard(state_->lock);
      state_->token += 1;
      state_->queued = false;
    }
    armed_.remove_all();
  }

 private:
  std::shared_ptr<WatchState> state_;
  ArmedHooks armed_;
};

// The gradient each parameter's last optimizer step consumed, weakly, with its version counter then: the loop
// invariants' stale-gradient check (`instrument/consumed.py`, which holds the same in Python without this part).
class Consumed {
 public:
  explicit Consumed(size_t count) : entries_(count) {}

  // An optimizer step is about to consume the gradients of `parameters[i]` for i in `held`: counts those that
  // have one and notes each, and returns (that count, the indices whose gradient is the very tensor the last
  // step consumed, changed in place since).
  py::tuple consume(const std::vector<at::Tensor>& parameters, const std::vector<int64_t>& held) {
    int64_t with_grad = 0;
    std::vector<int64_t> grown;
    for (int64_t i : held) {
      if (i < 0 || static_cast<size_t>(i) >= entries_.size() || static_cast<size_t>(i) >= parameters.size()) {
        throw py::index_error("Consumed.consume: a held index is outside the parameters");
      }
      const at::Tensor& grad = parameters[i].grad();
      if (!grad.defined()) continue;
      ++with_grad;
      Entry& e = entries_[i];
      auto version = static_cast<int64_t>(grad._version());
      if (e.noted && e.version != version && e.seen.lock().get() == grad.unsafeGetTensorImpl()) grown.push_back(i);
      e.seen = c10::weak_intrusive_ptr<c10::TensorImpl>(grad.getIntrusivePtr());
      e.version = version;
      e.noted = true;
    }
    py::list out(grown.size());
    for (size_t k = 0; k < grown.size(); ++k) out[k] = py::int_(grown[k]);
    return py::make_tuple(with_grad, out);
  }

  // The version the gradient of parameter `i` had when the last step consumed it, if `grad` is that tensor;
  // else None.
  py::object version_if(int64_t i, py::handle grad) const {
    if (i < 0 || static_cast<size_t>(i) >= entries_.size()) throw py::index_error("Consumed.version_if: no such index");
    const Entry& e = entries_[i];
    if (!e.noted || !THPVariable_Check(grad.ptr())) return py::none();
    const at::Tensor& t = THPVariable_Unpack(grad.ptr());
    if (!t.defined() || e.seen.lock().get() != t.unsafeGetTensorImpl()) return py::none();
    return py::int_(e.version);
  }

  void forget() {
    for (auto& e : entries_) e = Entry();
  }

 private:
  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl> seen{c10::intrusive_ptr<c10::TensorImpl>()};
    int64_t version = 0;
    bool noted = false;
  };

  std::vector<Entry> entries_;
};

// What the forward hook of every module output asks of it (`instrument/outputs.py`), in one call: bit 1 when
// its autograd node is defined in Python (a custom autograd Function, of which a `torch.compile` region's is
// one; its Python class tells which), bit 2 when saved-tensor hooks are active now (a non-reentrant
// checkpoint, `save_on_cpu`: `torch._C._autograd._top_saved_tensors_default_hooks(False)` is not None).
int64_t output_flags(const at::Tensor& tensor) {
  int64_t flags = 0;
  if (tensor.defined()) {
    auto node = tensor.grad_fn();
    if (node && std::strstr(typeid(*node).name(), "PyNode") != nullptr) flags |= 1;
  }
  if (at::SavedTensorDefaultHooks::get_hooks(/*ignore_is_tracing=*/false).has_value()) flags |= 2;
  return flags;
}

// The value of a one-element host tensor of a floating dtype, read from its memory: `Tensor.item` goes
// through the dispatcher, whose tables are out of the caches between a model's passes (tens of µs then).
// None for any other tensor (the caller falls back to `item`).
py::object scalar(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.device().is_cpu() || tensor.layout() != at::kStrided || tensor.numel() != 1 ||
      tensor.is_neg() || tensor.is_conj()) {
    return py::none();
  }
  const void* data = tensor.const_data_ptr();
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return py::float_(static_cast<double>(*static_cast<const float*>(data)));
    case at::kDouble:
      return py::float_(*static_cast<const double*>(data));
    case at::kHalf:
      return py::float_(static_cast<double>(static_cast<float>(*static_cast<const at::Half*>(data))));
    case at::kBFloat16:
      return py::float_(static_cast<double>(static_cast<float>(*static_cast<const at::BFloat16*>(data))));
    default:
      return py::none();
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Taps>(m, "Taps")
      .def(py::init<py::object, py::object>(), py::arg("on_start"), py::arg("on_end"))
      .def("tap", &Taps::tap, py::arg("tensor"), py::arg("index"), py::arg("batched") = false)
      .def("take", &Taps::take)
      .def("take_packed", &Taps::take_packed, py::arg("addresses"), py::arg("sizes"), py::arg("batches"))
      .def("pending", &Taps::pending)
      .def("armed", &Taps::armed)
      .def("compiled", &Taps::compiled)
      .def("reset", &Taps::reset);
  py::class_<Marks>(m, "Marks")
      .def(py::init<>())
      .def("watch", &Marks::watch, py::arg("parameter"), py::arg("index"))
      .def("unwatch", &Marks::unwatch)
      .def("take", &Marks::take)
      .def("take_packed", &Marks::take_packed, py::arg("addresses"), py::arg("sizes"))
      .def("forget", &Marks::forget)
      .def("has_fresh", &Marks::has_fresh)
      .def("compiled", &Marks::compiled)
      .def("watched", &Marks::watched);
  py::class_<Polled>(m, "Polled")
      .def(py::init<>())
      .def("watch", &Polled::watch, py::arg("parameter"), py::arg("index"))
      .def("watched", &Polled::watched)
      .def("forget", &Polled::forget)
      .def("changed", &Polled::changed, py::arg("unread"), py::arg("force"), py::arg("addresses"), py::arg("sizes"));
  py::class_<HostView>(m, "HostView")
      .def(py::init<const at::Tensor&, int64_t>(), py::arg("example"), py::arg("batch"))
      .def("usable", &HostView::usable)
      .def("view", &HostView::view, py::arg("tensor"));
  py::class_<BackwardWatch>(m, "BackwardWatch")
      .def(py::init<py::object>(), py::arg("on_end"))
      .def("arm", &BackwardWatch::arm, py::arg("tensor"))
      .def("take_compiled", &BackwardWatch::take_compiled)
      .def("reset", &BackwardWatch::reset);
  py::class_<Consumed>(m, "Consumed")
      .def(py::init<size_t>(), py::arg("count"))
      .def("consume", &Consumed::consume, py::arg("parameters"), py::arg("held"))
      .def("version_if", &Consumed::version_if, py::arg("index"), py::arg("grad"))
      .def("forget", &Consumed::forget);
  py::class_<Layout>(m, "Layout")
      .def(py::init<const std::vector<at::Tensor>&>(), py::arg("tensors"))
      .def("same", &Layout::same, py::arg("tensors"));
  m.def("grad_fingerprint", &grad_fingerprint, py::arg("parameters"));
  m.def("version_sum", &version_sum, py::arg("tensors"));
  m.def("output_flags", &output_flags, py::arg("tensor"));
  m.def("scalar", &scalar, py::arg("tensor"));
  m.def("pack", &pack_into, py::arg("tensors"), py::arg("addresses"), py::arg("sizes"),
        "Fill `addresses` and `sizes` with the tensors' data pointers and element counts; returns their "
        "common dtype code (0 float32, 1 float64), -1 when one is no lean host array or the dtypes differ, -2 "
        "when the arrays are too short.");
}
