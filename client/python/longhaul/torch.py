"""longhaul.torch: DiLoCo outer steps across sites over a longhaul.ExchangeGroup.

    import longhaul, longhaul.torch
    group = longhaul.ExchangeGroup(address, "run42", ["site-a", "site-b", "site-c"])
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    step = longhaul.torch.OuterStep(group, model, outer)
    for _ in range(outer_steps):
        for _ in range(inner_steps):
            ...                   # local optimizer steps on the model
        step.step()               # average pseudo-gradients, apply the outer update

An outer step computes each parameter's pseudo-gradient (the round's global
parameters minus the local ones), copies them into a few contiguous buckets
of at most `bucket_bytes` each (`plan_buckets`), all-reduces every bucket
with AVG, and applies the average: with an outer optimizer, as the
parameters' `.grad` for one `outer_optimizer.step()` from the global
parameters; without one, as `global - average` (plain parameter averaging).

`step(async_op=True)` returns a `Handle` at once: the all-reduces run on a
background thread (the binding releases the GIL while it waits), so the
caller can run the next inner steps meanwhile. `Handle.wait()` applies the
outer update on the caller's thread and keeps the inner progress made since
the call: each parameter becomes new_global + (now - at_call).

Determinism: the daemon's all-reduce gives every site the same bytes
(contributions reduced in sorted site order, EXCHANGE.md), and the bucket plan
depends only on the parameters' shapes and order, so sites with the same
model, the same global parameters and the same outer-optimizer state (and the
same torch build) end every outer step with bit-identical global parameters
(`global_parameters()`; after a synchronous `step()` the model's parameters
are those). `state_dict()`/`load_state_dict()` and `send_object`/`recv_object`
bring a site that (re)joins to that state.

Failures: nothing here swallows an error. A peer lost in the middle of an
all-reduce raises longhaul.PeerLostError (retryable, `.peer` names the site)
from `step()`, `average()` or `Handle.wait()`; the group has then moved to its
next generation without that site. The model, the global parameters, the
outer optimizer and `round` are left as they were before the failed step, so
the caller may call `step()` again (it recomputes the pseudo-gradients from
the current parameters) on the same group, or on a new one after a re-join
(assign `outer_step.group`).

Not thread-safe: one OuterStep is driven by one thread; the background
thread of a pending Handle only touches the OuterStep's own buckets.
"""

import io
import struct
import threading

import torch

import longhaul

DEFAULT_BUCKET_BYTES = 64 << 20
REDUCE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def plan_buckets(tensors, bucket_bytes=DEFAULT_BUCKET_BYTES, dtype=torch.float32):
    """Groups `tensors`, in order, into buckets of at most `bucket_bytes` each
    when stored as `dtype`; a tensor larger than that has a bucket of its
    own. Returns lists of indices into `tensors`. The plan depends only on
    the tensors' sizes, so sites with the same model make the same plan."""
    if bucket_bytes <= 0:
        raise ValueError("bucket_bytes must be positive")
    item = torch.empty((), dtype=dtype).element_size()
    buckets, current, current_bytes = [], [], 0
    for i, t in enumerate(tensors):
        size = t.numel() * item
        if current and current_bytes + size > bucket_bytes:
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(i)
        current_bytes += size
    if current:
        buckets.append(current)
    return buckets


class Buckets:
    """Contiguous `dtype` buffers for a fixed list of tensor shapes, split by
    `plan_buckets`, reused from call to call. Owns its buffers; `views()`
    are views into them. Not thread-safe."""

    def __init__(self, tensors, bucket_bytes=DEFAULT_BUCKET_BYTES, dtype=torch.float32):
        if dtype not in REDUCE_DTYPES:
            raise TypeError("the buckets' dtype must be float32, bfloat16 or float16")
        self.dtype = dtype
        self.shapes = [tuple(t.shape) for t in tensors]
        self.plan = plan_buckets(tensors, bucket_bytes, dtype)
        self.flats = [torch.zeros(sum(tensors[i].numel() for i in b), dtype=dtype)
                      for b in self.plan]
        self._views = [None] * len(self.shapes)
        for b, flat in zip(self.plan, self.flats):
            offset = 0
            for i in b:
                n = tensors[i].numel()
                self._views[i] = flat[offset:offset + n].view(self.shapes[i])
                offset += n

    def views(self):
        """One view per tensor, shaped like it, into the buckets."""
        return list(self._views)

    def bucket_bytes(self):
        return [f.numel() * f.element_size() for f in self.flats]

    def _check(self, tensors):
        if len(tensors) != len(self.shapes):
            raise ValueError("expected %d tensors, got %d" % (len(self.shapes), len(tensors)))
        for i, t in enumerate(tensors):
            if tuple(t.shape) != self.shapes[i]:
                raise ValueError("tensor %d has shape %s, not %s" %
                                 (i, tuple(t.shape), self.shapes[i]))

    def flatten(self, tensors):
        """Copies `tensors` into the buckets (converting to the buckets' dtype)."""
        self._check(tensors)
        with torch.no_grad():
            for view, t in zip(self._views, tensors):
                view.copy_(t)

    def unflatten(self, out):
        """Copies the buckets back into the tensors `out`, in place."""
        self._check(out)
        with torch.no_grad():
            for view, t in zip(self._views, out):
                t.copy_(view)
        return out


def allreduce_buckets(group, flats, tag, timeout=300.0):
    """All-reduces (AVG) each flat buffer in turn under `tag`/k."""
    for k, flat in enumerate(flats):
        group.allreduce(flat, op="avg", tag="%s/%d" % (tag, k), timeout=timeout)


class Handle:
    """An outer step whose all-reduces run on a background thread. `wait()`
    finishes it on the calling thread."""

    def __init__(self, run, finish):
        self._finish = finish
        self._error = None
        self._result = None
        self._finished = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(run,),
                                        name="longhaul-outer-step", daemon=True)
        self._thread.start()

    def _run(self, run):
        try:
            run()
        except BaseException as e:  # noqa: B902 - raised again by wait()
            self._error = e
        finally:
            self._done.set()

    def done(self):
        """True once the all-reduces have finished (successfully or not)."""
        return self._done.is_set()

    def wait(self, timeout=None):
        """Waits for the all-reduces (seconds; None = forever), then applies
        the result. Raises what the all-reduce raised (e.g.
        longhaul.PeerLostError), or the builtin TimeoutError if still running
        after `timeout` (the handle stays usable)."""
        if not self._done.wait(timeout):
            raise TimeoutError("the outer step's all-reduces are still running")
        self._thread.join()
        if self._error is not None:
            raise self._error
        if not self._finished:
            self._result = self._finish()
            self._finished = True
        return self._result


class _Done:
    """A handle for work that already finished (async_op=False)."""

    def __init__(self, result):
        self._result = result

    def done(self):
        return True

    def wait(self, timeout=None):
        return self._result


class OuterStep:
    """DiLoCo's outer step for `model` across the sites of `group`.

    `outer_optimizer` (optional) must optimize the model's parameters; its
    state must be the same at every site. `bucket_bytes` caps each
    all-reduce; `dtype` is the pseudo-gradients' type on the wire
    (float32, bfloat16 or float16). `tag` prefixes the all-reduces' tags, with
    `round` (the number of outer steps done) so that sites out of step fail
    instead of mixing rounds.

    The global parameters are the model's at construction (or at `reset()` /
    `load_state_dict()`). Only parameters that require grad take part;
    buffers (e.g. BatchNorm running statistics) are not averaged."""

    def __init__(self, group, model, outer_optimizer=None, bucket_bytes=DEFAULT_BUCKET_BYTES,
                 dtype=torch.float32, tag="outer", timeout=300.0):
        self.group = group
        self.outer_optimizer = outer_optimizer
        self.tag = tag
        self.timeout = timeout
        self.round = 0
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise ValueError("the model has no parameters that require grad")
        self._buckets = Buckets(self._params, bucket_bytes, dtype)
        self._global = None
        self._pending = None
        self.reset()

    @property
    def buckets(self):
        return self._buckets

    def reset(self):
        """Takes the model's current parameters as the global ones."""
        self._check_idle()
        with torch.no_grad():
            self._global = [p.detach().clone() for p in self._params]

    def global_parameters(self):
        """The global parameters after the last outer step (bit-identical at
        every site). Not copies: do not modify."""
        return list(self._global)

    def state_dict(self):
        """What a (re)joining site needs to take part: the round, the global
        parameters and the outer optimizer's state."""
        return {
            "round": self.round,
            "global": [g.clone() for g in self._global],
            "outer_optimizer": (self.outer_optimizer.state_dict()
                                if self.outer_optimizer is not None else None),
        }

    def load_state_dict(self, state):
        """Adopts another site's state_dict(): the model's parameters become
        the global ones."""
        self._check_idle()
        if len(state["global"]) != len(self._params):
            raise ValueError("the state has %d parameters, the model %d" %
                             (len(state["global"]), len(self._params)))
        with torch.no_grad():
            for p, g in zip(self._params, state["global"]):
                p.copy_(g)
        if self.outer_optimizer is not None and state.get("outer_optimizer") is not None:
            self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        self.round = int(state["round"])
        self.reset()

    def average(self, pseudo_grads, async_op=False):
        """Averages `pseudo_grads` (one tensor per parameter) across the
        sites, in place; returns them (or a Handle whose wait() does). Does
        not touch the model or `round`."""
        self._check_idle()
        self._buckets.flatten(pseudo_grads)
        tag = "%s-%d-avg" % (self.tag, self.round)
        return self._launch(tag, lambda: self._buckets.unflatten(pseudo_grads), async_op)

    def step(self, async_op=False):
        """One outer step from the model's current (local) parameters. With
        async_op, returns a Handle at once; the model may keep training until
        its wait(). Returns None (or the Handle)."""
        self._check_idle()
        with torch.no_grad():
            for view, g, p in zip(self._buckets.views(), self._global, self._params):
                if view.dtype == p.dtype:
                    torch.sub(g, p, out=view)
                else:
                    view.copy_(g - p)
            at_call = [p.detach().clone() for p in self._params] if async_op else None
        tag = "%s-%d" % (self.tag, self.round)
        return self._launch(tag, lambda: self._apply(at_call), async_op)

    def _launch(self, tag, finish, async_op):
        group, flats, timeout = self.group, self._buckets.flats, self.timeout

        def run():
            allreduce_buckets(group, flats, tag, timeout)

        if not async_op:
            run()
            return finish()

        def finish_and_clear():
            self._pending = None
            return finish()

        handle = Handle(run, finish_and_clear)
        self._pending = handle
        return handle

    def _check_idle(self):
        pending = self._pending
        if pending is None:
            return
        if pending.done() and pending._error is not None:
            self._pending = None  # a failed step changed nothing; a new one may start
            return
        raise RuntimeError("an outer step is still in flight: wait() for its handle first")

    def _apply(self, at_call):
        with torch.no_grad():
            drift = None
            if at_call is not None:
                drift = [p - a for p, a in zip(self._params, at_call)]
            average = self._buckets.views()
            if self.outer_optimizer is None:
                for g, a, p in zip(self._global, average, self._params):
                    g.sub_(a.to(g.dtype))
                    p.copy_(g)
            else:
                for g, a, p in zip(self._global, average, self._params):
                    p.copy_(g)
                    p.grad = a.to(dtype=p.dtype, copy=True)
        if self.outer_optimizer is not None:
            self.outer_optimizer.step()
            self.outer_optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                for g, p in zip(self._global, self._params):
                    g.copy_(p)
        if drift is not None:
            with torch.no_grad():
                for p, d in zip(self._params, drift):
                    p.add_(d)
        self.round += 1


def average_pseudo_gradients(group, params_before, params_after,
                             bucket_bytes=DEFAULT_BUCKET_BYTES, dtype=torch.float32,
                             tag="pseudo-grad", timeout=300.0):
    """Returns the sites' average of (before - after), one new tensor per
    parameter (in the parameters' dtype), through bucketed AVG all-reduces.
    Every site must call it with the same shapes and `tag`."""
    with torch.no_grad():
        grads = [b.detach() - a.detach() for b, a in zip(params_before, params_after)]
    buckets = Buckets(grads, bucket_bytes, dtype)
    buckets.flatten(grads)
    allreduce_buckets(group, buckets.flats, tag, timeout)
    return buckets.unflatten(grads)


_LENGTH = struct.Struct("<Q")


def send_object(group, site, tag, obj, timeout=60.0):
    """Sends `obj` (anything torch.save takes, e.g. OuterStep.state_dict())
    to `site`, which takes it with recv_object(group, this site, tag)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = buf.getvalue()
    group.send(site, tag + "/length", _LENGTH.pack(len(payload)), timeout=timeout)
    group.send(site, tag, payload, timeout=timeout)


def recv_object(group, site, tag, timeout=60.0):
    """Receives what send_object(group, site=this site, tag) sent from `site`."""
    header = bytearray(_LENGTH.size)
    group.recv(site, tag + "/length", header, timeout=timeout)
    (length,) = _LENGTH.unpack(bytes(header))
    payload = bytearray(length)  # torch.save never writes nothing
    got = group.recv(site, tag, payload, timeout=timeout)
    if got != length:
        raise longhaul.Error("recv_object: %d of %d bytes from %s" % (got, length, site))
    return torch.load(io.BytesIO(bytes(payload)))
