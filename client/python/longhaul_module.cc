// `import longhaul`: the Python binding of the client library.
//
// Buffers (numpy arrays through the buffer protocol, CPU torch tensors
// through data_ptr) are read and written in place by C++; Python never
// copies them. Every blocking call releases the GIL. Errors become
// longhaul.Error (a RuntimeError) with the library's message; a peer that
// dropped out is longhaul.PeerLostError (retryable, .peer names it), a
// deadline is longhaul.TimeoutError (also a builtin TimeoutError) and a
// cancel is longhaul.CancelledError.

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/units_parse.h"
#include "google/protobuf/util/json_util.h"
#include "longhaul/client.h"
#include "longhaul/exchange.h"

namespace py = pybind11;

namespace longhaul::python {
namespace {

PyObject* g_error = nullptr;
PyObject* g_peer_lost = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_cancelled = nullptr;

[[noreturn]] void Throw(const absl::Status& status) {
  PyObject* type = g_error;
  if (IsPeerLost(status)) {
    type = g_peer_lost;
  } else if (status.code() == absl::StatusCode::kDeadlineExceeded) {
    type = g_timeout;
  } else if (status.code() == absl::StatusCode::kCancelled) {
    type = g_cancelled;
  }
  py::object exc = py::handle(type)(std::string(status.message()));
  exc.attr("code") = absl::StatusCodeToString(status.code());
  exc.attr("peer") = IsPeerLost(status) ? py::object(py::str(LostPeer(status))) : py::none();
  exc.attr("retryable") = IsPeerLost(status) || status.code() == absl::StatusCode::kUnavailable ||
                          status.code() == absl::StatusCode::kAborted;
  PyErr_SetObject(type, exc.ptr());
  throw py::error_already_set();
}

void Check(const absl::Status& status) {
  if (!status.ok()) Throw(status);
}

template <typename T>
T Unwrap(absl::StatusOr<T> value) {
  if (!value.ok()) Throw(value.status());
  return *std::move(value);
}

absl::Duration Seconds(std::optional<double> seconds) {
  if (!seconds) return absl::InfiniteDuration();
  return absl::Seconds(*seconds);
}

py::object ToDict(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  auto s = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!s.ok()) throw std::runtime_error("cannot convert a status to a dict");
  return py::module_::import("json").attr("loads")(json);
}

// A contiguous CPU buffer borrowed from a Python object for one operation.
struct Borrowed {
  void* data = nullptr;
  size_t bytes = 0;
  std::optional<DType> dtype;  // when it is one all-reduce accepts
  py::object owner;            // keeps the memory alive
  std::unique_ptr<py::buffer_info> info;
};

Borrowed Borrow(py::object obj, bool writable) {
  Borrowed b;
  b.owner = obj;
  if (py::hasattr(obj, "data_ptr") && py::hasattr(obj, "element_size")) {  // torch.Tensor
    if (py::str(obj.attr("device").attr("type")).cast<std::string>() != "cpu") {
      throw py::value_error("longhaul exchanges CPU tensors only; call .cpu() first");
    }
    if (!obj.attr("is_contiguous")().cast<bool>()) {
      throw py::value_error("the tensor is not contiguous; call .contiguous() first");
    }
    b.data = reinterpret_cast<void*>(obj.attr("data_ptr")().cast<uintptr_t>());
    b.bytes = obj.attr("numel")().cast<size_t>() * obj.attr("element_size")().cast<size_t>();
    std::string dtype = py::str(obj.attr("dtype")).cast<std::string>();
    if (dtype == "torch.float32") b.dtype = DType::kFloat32;
    if (dtype == "torch.bfloat16") b.dtype = DType::kBFloat16;
    if (dtype == "torch.float16") b.dtype = DType::kFloat16;
    return b;
  }
  if (!PyObject_CheckBuffer(obj.ptr())) {
    throw py::type_error("expected a numpy array, a CPU torch tensor or another buffer");
  }
  b.info = std::make_unique<py::buffer_info>(py::reinterpret_borrow<py::buffer>(obj).request(writable));
  const py::buffer_info& info = *b.info;
  py::ssize_t expected = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expected) {
      throw py::value_error("the array is not C-contiguous; use numpy.ascontiguousarray");
    }
    expected *= info.shape[d];
  }
  b.data = info.ptr;
  b.bytes = static_cast<size_t>(info.size * info.itemsize);
  if (info.format == "f" && info.itemsize == 4) b.dtype = DType::kFloat32;
  if (info.format == "e" && info.itemsize == 2) b.dtype = DType::kFloat16;
  return b;
}

// An operation in flight, with the Python object whose memory it uses.
class PyWork {
 public:
  PyWork(std::unique_ptr<ExchangeWork> work, Borrowed buffer)
      : work_(std::move(work)), buffer_(std::move(buffer)) {}
  ~PyWork() {
    py::gil_scoped_release release;
    work_.reset();  // waits for the operation: it may still write the buffer
  }

  void Wait(std::optional<double> timeout) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = work_->Wait(Seconds(timeout));
    }
    Check(s);
  }
  bool Test() { return work_->Test(); }
  void Cancel() {
    py::gil_scoped_release release;
    work_->Cancel();
  }
  py::dict Stats() {
    ExchangeStats s = work_->Stats();
    py::dict d;
    d["bytes_sent"] = s.bytes_sent;
    d["bytes_received"] = s.bytes_received;
    d["peers"] = s.peers;
    d["seconds"] = s.seconds;
    d["generation"] = s.generation;
    return d;
  }

 private:
  std::unique_ptr<ExchangeWork> work_;
  Borrowed buffer_;
};

ReduceOp ParseOp(const std::string& op) {
  if (op == "sum") return ReduceOp::kSum;
  if (op == "avg" || op == "mean") return ReduceOp::kAvg;
  throw py::value_error("op must be 'sum' or 'avg'");
}

class PyGroup {
 public:
  PyGroup(const std::string& address, const std::string& name, std::vector<std::string> sites,
          double timeout) {
    absl::StatusOr<std::unique_ptr<ExchangeGroup>> g;
    {
      py::gil_scoped_release release;
      g = ExchangeGroup::Join(address, name, std::move(sites), absl::Seconds(timeout));
    }
    group_ = Unwrap(std::move(g));
  }

  py::object AllReduce(py::object tensor, const std::string& op, bool quantize, double timeout,
                       const std::string& tag, bool async_op) {
    Borrowed b = Borrow(tensor, /*writable=*/true);
    if (!b.dtype) {
      throw py::type_error("allreduce takes float32, bfloat16 or float16 data");
    }
    AllReduceOptions options;
    options.op = ParseOp(op);
    options.quantize_int8 = quantize;
    options.timeout = absl::Seconds(timeout);
    options.tag = tag;
    const size_t count = b.bytes / ElementSize(*b.dtype);
    std::unique_ptr<ExchangeWork> work;
    {
      py::gil_scoped_release release;
      work = Live().AllReduce(b.data, count, *b.dtype, options);
    }
    auto handle = std::make_unique<PyWork>(std::move(work), std::move(b));
    if (async_op) return py::cast(std::move(handle));
    handle->Wait(std::nullopt);
    return py::none();
  }

  // A new array or tensor like `tensor` with `n` times its rows (n elements
  // for a scalar): where an all-gather of `tensor` goes.
  static py::object GatheredLike(py::object tensor, size_t n) {
    const bool is_torch = py::hasattr(tensor, "data_ptr") && py::hasattr(tensor, "element_size");
    py::object like = is_torch ? tensor : py::module_::import("numpy").attr("asarray")(tensor);
    py::list shape(like.attr("shape"));
    if (shape.empty()) {
      shape.append(n);
    } else {
      shape[0] = py::int_(shape[0].cast<size_t>() * n);
    }
    if (is_torch) return like.attr("new_empty")(py::tuple(shape));
    return py::module_::import("numpy").attr("empty")(py::tuple(shape),
                                                      py::arg("dtype") = like.attr("dtype"));
  }

  py::object AllGather(py::object tensor, double timeout, const std::string& tag) {
    Borrowed in = Borrow(tensor, /*writable=*/false);
    const size_t members = Live().members().size();
    py::object gathered = GatheredLike(tensor, members);
    Borrowed out = Borrow(gathered, /*writable=*/true);
    CollectiveOptions options;
    options.timeout = absl::Seconds(timeout);
    options.tag = tag;
    absl::Status s;
    ExchangeStats stats;
    {
      py::gil_scoped_release release;
      auto work = Live().AllGather(in.data, in.bytes, out.data, out.bytes, options);
      s = work->Wait();
      stats = work->Stats();
    }
    Check(s);
    // The group may have lost members since `members` was read.
    const size_t got = stats.peers + 1;
    if (got == members) return gathered;
    const size_t rows = got * (py::list(gathered.attr("shape"))[0].cast<size_t>() / members);
    return gathered[py::slice(0, static_cast<py::ssize_t>(rows), 1)];
  }

  py::object Broadcast(py::object tensor, const std::string& root, double timeout,
                       const std::string& tag, bool async_op) {
    Borrowed b = Borrow(tensor, /*writable=*/true);
    CollectiveOptions options;
    options.timeout = absl::Seconds(timeout);
    options.tag = tag;
    std::unique_ptr<ExchangeWork> work;
    {
      py::gil_scoped_release release;
      work = Live().Broadcast(b.data, b.bytes, root, options);
    }
    auto handle = std::make_unique<PyWork>(std::move(work), std::move(b));
    if (async_op) return py::cast(std::move(handle));
    handle->Wait(std::nullopt);
    return py::none();
  }

  py::object Send(const std::string& site, const std::string& tag, py::object data, double timeout,
                  bool async_op) {
    Borrowed b = Borrow(data, /*writable=*/false);
    if (!async_op) {
      absl::Status s;
      {
        py::gil_scoped_release release;
        s = Live().Send(site, tag, b.data, b.bytes, absl::Seconds(timeout));
      }
      Check(s);
      return py::none();
    }
    std::unique_ptr<ExchangeWork> work;
    {
      py::gil_scoped_release release;
      work = Live().SendAsync(site, tag, b.data, b.bytes, absl::Seconds(timeout));
    }
    return py::cast(std::make_unique<PyWork>(std::move(work), std::move(b)));
  }

  size_t Recv(const std::string& site, const std::string& tag, py::object out, double timeout) {
    Borrowed b = Borrow(out, /*writable=*/true);
    absl::StatusOr<size_t> n;
    {
      py::gil_scoped_release release;
      n = Live().Recv(site, tag, b.data, b.bytes, absl::Seconds(timeout));
    }
    return Unwrap(std::move(n));
  }

  void Close() {
    py::gil_scoped_release release;
    group_.reset();
  }

  ExchangeGroup& Live() {
    if (!group_) throw std::runtime_error("the group is closed");
    return *group_;
  }

 private:
  std::unique_ptr<ExchangeGroup> group_;
};

v1::PriorityClass ParsePriority(const std::string& priority) {
  if (priority == "exchange") return v1::EXCHANGE;
  if (priority == "checkpoint") return v1::CHECKPOINT;
  if (priority == "background") return v1::BACKGROUND;
  throw py::value_error("priority must be 'exchange', 'checkpoint' or 'background'");
}

const char* PriorityName(v1::PriorityClass priority) {
  if (priority == v1::EXCHANGE) return "exchange";
  if (priority == v1::BACKGROUND) return "background";
  return "checkpoint";
}

// A rate as `longhaul limit` takes it: bits per second as an int, or text
// such as "500Mbit" or "2Gbit"; 0, "0" and "off" mean no cap.
uint64_t BitsPerSecond(py::object rate) {
  if (py::isinstance<py::int_>(rate)) {
    const long long bps = rate.cast<long long>();
    if (bps < 0) throw py::value_error("rate must not be negative");
    return static_cast<uint64_t>(bps);
  }
  const std::string text = py::str(rate).cast<std::string>();
  if (text == "off" || text == "0") return 0;
  absl::StatusOr<uint64_t> bps = ParseBitRate(text);
  if (!bps.ok()) throw py::value_error(absl::StrCat("rate: ", bps.status().message()));
  return *bps;
}

class PyClient {
 public:
  explicit PyClient(const std::string& address, double timeout) {
    absl::StatusOr<std::unique_ptr<Client>> c;
    {
      py::gil_scoped_release release;
      c = Client::Connect(address, absl::Seconds(timeout));
    }
    client_ = Unwrap(std::move(c));
  }

  py::object Submit(std::vector<std::string> sources, const std::string& dest,
                    const std::string& request_id, bool sync, const std::string& priority,
                    uint32_t streams, uint64_t chunk_size, const std::string& transport,
                    const std::vector<std::string>& also,
                    const std::vector<std::string>& commit_last, bool checksum,
                    const std::string& symlinks, bool hard_links) {
    Destination d = Unwrap(ParseDestination(dest));
    v1::TransferSpec spec;
    // A pull or third-party copy, as `longhaul cp SITE:/EXPORT/PATH DEST`:
    // its one source is remote.
    if (sources.size() == 1 && IsRemoteLocation(sources[0])) {
      Destination source = Unwrap(ParseDestination(sources[0]));
      spec.set_source_site(source.site);
      spec.set_source_export(source.export_name);
      spec.set_source_path(source.path);
    } else {
      for (auto& s : sources) spec.add_sources(s);
    }
    for (const std::string& glob : commit_last) spec.add_commit_last(glob);
    spec.set_checksum(checksum);
    spec.set_symlinks(symlinks);
    spec.set_hard_links(hard_links);
    spec.set_dest_site(d.site);
    spec.set_dest_export(d.export_name);
    spec.set_dest_path(d.path);
    for (const std::string& text : also) {
      Destination a = Unwrap(ParseDestination(text));
      v1::Destination* more = spec.add_also();
      more->set_site(a.site);
      more->set_export_name(a.export_name);
      more->set_path(a.path);
    }
    spec.set_sync(sync);
    spec.set_streams(streams);
    spec.set_chunk_size(chunk_size);
    spec.set_transport(transport);
    spec.set_priority(ParsePriority(priority.empty() ? "checkpoint" : priority));
    absl::StatusOr<v1::TransferStatus> st;
    {
      py::gil_scoped_release release;
      st = client_->Submit(spec, request_id);
    }
    return ToDict(Unwrap(std::move(st)));
  }

  py::object Get(const std::string& id) { return Call([&] { return client_->Get(id); }); }
  py::object Cancel(const std::string& id) { return Call([&] { return client_->Cancel(id); }); }
  py::object Pause(const std::string& id) {
    return Call([&] { return client_->Pause(id); });
  }
  py::object Resume(const std::string& id) {
    return Call([&] { return client_->Resume(id); });
  }

  py::list List(bool all) {
    absl::StatusOr<std::vector<v1::TransferStatus>> transfers;
    {
      py::gil_scoped_release release;
      transfers = client_->List(all);
    }
    py::list out;
    for (const v1::TransferStatus& t : Unwrap(std::move(transfers))) out.append(ToDict(t));
    return out;
  }

  py::object Verify(const std::string& id) {
    absl::StatusOr<v1::VerifyResponse> result;
    {
      py::gil_scoped_release release;
      result = client_->Verify(id);
    }
    return ToDict(Unwrap(std::move(result)));
  }

  py::object Peers(bool probe) {
    absl::StatusOr<v1::PeersResponse> peers;
    {
      py::gil_scoped_release release;
      peers = client_->Peers(probe);
    }
    return ToDict(Unwrap(std::move(peers)));
  }

  // `longhaul limit`: with no rate, the caps in force; with one, sets the cap
  // of exactly one of `peer` or `priority` (0, "0" or "off" removes it).
  // Returns every cap now in force, as dicts like the CLI's --json.
  py::list Limit(py::object rate, const std::string& peer, const std::string& priority) {
    absl::StatusOr<std::vector<v1::RateLimit>> limits;
    if (rate.is_none()) {
      if (!peer.empty() || !priority.empty()) {
        throw py::value_error("limit: give a rate with peer= or priority=");
      }
      py::gil_scoped_release release;
      limits = client_->GetLimits();
    } else {
      if (peer.empty() == priority.empty()) {
        throw py::value_error("limit: name exactly one of peer= or priority=");
      }
      v1::RateLimit limit;
      if (!peer.empty()) {
        limit.set_peer(peer);
      } else {
        limit.set_priority(ParsePriority(priority));
      }
      limit.set_bits_per_second(BitsPerSecond(rate));
      py::gil_scoped_release release;
      limits = client_->SetLimit(limit);
    }
    py::list out;
    for (const v1::RateLimit& l : Unwrap(std::move(limits))) {
      py::dict d;
      if (l.scope_case() == v1::RateLimit::kPeer) {
        d["peer"] = l.peer();
      } else {
        d["class"] = PriorityName(l.priority());
      }
      d["bits_per_second"] = l.bits_per_second();
      out.append(d);
    }
    return out;
  }

  py::object Wait(const std::string& id, std::optional<double> timeout, py::object progress) {
    return Call([&] {
      return client_->Wait(id, Seconds(timeout), Progress(progress));
    });
  }

  py::object Watch(const std::string& id, py::object callback) {
    return Call([&] { return client_->Watch(id, Progress(callback)); });
  }

 private:
  template <typename F>
  py::object Call(F f) {
    absl::StatusOr<v1::TransferStatus> st;
    {
      py::gil_scoped_release release;
      st = f();
    }
    if (pending_) {
      py::error_already_set e = std::move(*pending_);
      pending_.reset();
      throw e;
    }
    return ToDict(Unwrap(std::move(st)));
  }

  // Calls `callback(status_dict)` with the GIL held; the first exception it
  // raises is kept and raised once the call returns.
  std::function<void(const v1::TransferStatus&)> Progress(py::object callback) {
    if (callback.is_none()) return nullptr;
    return [this, callback](const v1::TransferStatus& status) {
      py::gil_scoped_acquire acquire;
      if (pending_) return;
      try {
        callback(ToDict(status));
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      } catch (py::error_already_set& e) {
        pending_.emplace(std::move(e));
      }
    };
  }

  std::unique_ptr<Client> client_;
  std::optional<py::error_already_set> pending_;
};

}  // namespace
}  // namespace longhaul::python

PYBIND11_MODULE(_longhaul, m) {      // re-exported by longhaul/__init__.py
  using namespace longhaul::python;  // NOLINT: the module's own classes
  m.doc() = "longhaul: move training data between sites (client of the local longhauld)";

  g_error = PyErr_NewException("longhaul.Error", PyExc_RuntimeError, nullptr);
  g_peer_lost = PyErr_NewException("longhaul.PeerLostError", g_error, nullptr);
  py::tuple timeout_bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_TimeoutError));
  g_timeout = PyErr_NewException("longhaul.TimeoutError", timeout_bases.ptr(), nullptr);
  g_cancelled = PyErr_NewException("longhaul.CancelledError", g_error, nullptr);
  m.attr("Error") = py::handle(g_error);
  m.attr("PeerLostError") = py::handle(g_peer_lost);
  m.attr("TimeoutError") = py::handle(g_timeout);
  m.attr("CancelledError") = py::handle(g_cancelled);

  py::class_<PyWork>(m, "Work", "An exchange operation in flight.")
      .def("wait", &PyWork::Wait, py::arg("timeout") = py::none(),
           "Waits for the result (seconds; None = forever). Raises on failure; "
           "longhaul.TimeoutError if still running after `timeout`.")
      .def("test", &PyWork::Test, "True once finished.")
      .def("cancel", &PyWork::Cancel, "Stops the operation at every site.")
      .def("stats", &PyWork::Stats, "bytes_sent, bytes_received, peers, seconds, generation.");

  py::class_<PyGroup>(m, "ExchangeGroup", "Membership of this site in a named group of sites.")
      .def(py::init<const std::string&, const std::string&, std::vector<std::string>, double>(),
           py::arg("address"), py::arg("name"), py::arg("sites"), py::arg("timeout") = 60.0,
           "Joins `name` with `sites` (every member, this one included) through the daemon at "
           "`address`, waiting up to `timeout` seconds for all of them.")
      .def("allreduce", &PyGroup::AllReduce, py::arg("tensor"), py::arg("op") = "sum",
           py::arg("quantize") = false, py::arg("timeout") = 60.0, py::arg("tag") = "",
           py::arg("async_op") = false,
           "In-place all-reduce of a float32/bfloat16/float16 numpy array or CPU tensor. "
           "Identical result at every site. The array is read while the call runs and written "
           "only when it succeeds: after an error it still holds its input, ready for a retry. "
           "Returns a Work if async_op (leave the array untouched until it is done).")
      .def("allgather", &PyGroup::AllGather, py::arg("tensor"), py::arg("timeout") = 60.0,
           py::arg("tag") = "",
           "All-gather of a numpy array or CPU tensor (any dtype; the same shape and dtype at "
           "every site). Returns a new array or tensor of the same kind holding every member's "
           "input concatenated along the first axis in sorted member order (a scalar gives a "
           "1-D result), identical at every site. Issued in the same order at every site as "
           "allreduce and broadcast.")
      .def("broadcast", &PyGroup::Broadcast, py::arg("tensor"), py::arg("root"),
           py::arg("timeout") = 60.0, py::arg("tag") = "", py::arg("async_op") = false,
           "In-place broadcast: the `root` site's numpy array or CPU tensor is copied, "
           "bit-identical, into every other site's (the same byte length everywhere). The root "
           "sends it to each member directly. Returns a Work if async_op.")
      .def("send", &PyGroup::Send, py::arg("site"), py::arg("tag"), py::arg("data"),
           py::arg("timeout") = 60.0, py::arg("async_op") = false)
      .def("recv", &PyGroup::Recv, py::arg("site"), py::arg("tag"), py::arg("out"),
           py::arg("timeout") = 60.0, "Receives into `out`; returns the message length in bytes.")
      .def("close", &PyGroup::Close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyGroup& g, py::args) { g.Close(); })
      .def_property_readonly("generation", [](PyGroup& g) { return g.Live().generation(); })
      .def_property_readonly("members", [](PyGroup& g) { return g.Live().members(); })
      .def_property_readonly("local_site", [](PyGroup& g) { return g.Live().local_site(); })
      .def_property_readonly("name", [](PyGroup& g) { return g.Live().name(); });

  py::class_<PyClient>(m, "Client", "A connection to the local longhauld.")
      .def(py::init<const std::string&, double>(), py::arg("address"), py::arg("timeout") = 5.0)
      .def("submit", &PyClient::Submit, py::arg("sources"), py::arg("dest"),
           py::arg("request_id") = "", py::arg("sync") = false, py::arg("priority") = "checkpoint",
           py::arg("streams") = 0, py::arg("chunk_size") = 0, py::arg("transport") = "",
           py::arg("also") = std::vector<std::string>(),
           py::arg("commit_last") = std::vector<std::string>(), py::arg("checksum") = false,
           py::arg("symlinks") = "", py::arg("hard_links") = false,
           "Submits a transfer of `sources` (local paths; a relative one is taken from the "
           "working directory) to 'SITE:/EXPORT/PATH', as `longhaul cp` (`sync=True`: "
           "`longhaul sync`). One source 'SITE:/EXPORT/PATH' pulls it, or copies it between "
           "two other sites. `also`: more destinations of a fan-out; `commit_last`: globs "
           "published last; `checksum`: sync compares content; `symlinks`: 'keep', 'follow' "
           "or 'refuse'; `hard_links`: keep hard links. Returns its status dict.")
      .def("get", &PyClient::Get, py::arg("id"))
      .def("list", &PyClient::List, py::arg("all") = false,
           "The transfers this site knows (all=True: ended ones too), as status dicts.")
      .def("cancel", &PyClient::Cancel, py::arg("id"))
      .def("pause", &PyClient::Pause, py::arg("id"), "Pauses a transfer; returns its status.")
      .def("resume", &PyClient::Resume, py::arg("id"), "Resumes a paused transfer.")
      .def("verify", &PyClient::Verify, py::arg("id"),
           "Re-reads a completed transfer's destination and compares digests; returns the "
           "result dict (its `ok` says whether every file matched).")
      .def("peers", &PyClient::Peers, py::arg("probe") = true,
           "Peer sites and their links, as `longhaul peers --json`.")
      .def("limit", &PyClient::Limit, py::arg("rate") = py::none(), py::arg("peer") = "",
           py::arg("priority") = "",
           "Without a rate: the rate caps in force. With one (bits per second, or text such "
           "as '500Mbit'; 0 or 'off' removes the cap): caps `peer` or the class `priority` at "
           "run time. Returns every cap now in force: [{'peer' or 'class', "
           "'bits_per_second'}].")
      .def("wait", &PyClient::Wait, py::arg("id"), py::arg("timeout") = py::none(),
           py::arg("progress") = py::none(),
           "Waits for the transfer to end; calls progress(status) as it goes.")
      .def("watch", &PyClient::Watch, py::arg("id"), py::arg("callback"),
           "Streams progress to callback(status) until the transfer ends.");
}
