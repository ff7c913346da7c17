"""monarch.tensorflow: registers the `monarch://` filesystem plugin.

    import monarch.tensorflow as monarch_tf
    monarch_tf.configure("/etc/monarch.yaml")  # or set MONARCH_CONFIG / MONARCH_DATASET
    monarch_tf.register()
    files = tf.data.Dataset.list_files(monarch_tf.uri("/lustre/imagenet") + "/train-*")

Lifetime: the plugin keeps one Monarch instance per process, shared by all of
TensorFlow's I/O threads and opened at the first monarch:// access, so
configure() only has an effect before that access. stats() and
wait_for_placement() call into the same loaded .so as TensorFlow (dlopen of
one path yields one handle), so they see the very instance TensorFlow reads
through.

Threading: every function may be called from any thread; register() is
idempotent.
"""

import ctypes
import glob
import json
import os
import threading

__all__ = ["plugin_path", "register", "configure", "uri", "stats", "wait_for_placement"]

_PLUGIN_NAME = "libmonarch_tf_plugin.so"
_lock = threading.Lock()
_lib = None  # The registered plugin, opened with ctypes; guarded by _lock.


def plugin_path():
    """Where the plugin .so is: $MONARCH_TF_PLUGIN, in the `monarch` package
    directory (where a wheel would bundle it; the wheel built by
    `pip install ./python` does not, see python/README.md), or the newest one
    in a build tree of the repository (<repo>/build*/) when the package runs
    from the source tree (python/monarch/)."""
    env = os.environ.get("MONARCH_TF_PLUGIN")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"MONARCH_TF_PLUGIN={env} does not exist")
        return os.path.abspath(env)
    here = os.path.dirname(os.path.abspath(__file__))
    candidate = os.path.join(here, _PLUGIN_NAME)
    if os.path.isfile(candidate):
        return candidate
    repo = os.path.dirname(os.path.dirname(here))
    built = glob.glob(os.path.join(repo, "build*", "**", _PLUGIN_NAME), recursive=True)
    if built:
        return max(built, key=os.path.getmtime)
    raise FileNotFoundError(
        f"{_PLUGIN_NAME} not found: set MONARCH_TF_PLUGIN or build the repository "
        "(see integrations/tensorflow/README.md)")


def register(path=None):
    """Registers the monarch:// scheme with TensorFlow (once per process) and
    returns the plugin's path."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib._name
        import tensorflow as tf  # Here, so importing this module stays cheap.
        path = os.path.abspath(path or plugin_path())
        tf.experimental.register_filesystem_plugin(path)
        lib = ctypes.CDLL(path)
        for fn in (lib.monarch_tf_stats_json, lib.monarch_tf_wait_for_placement):
            fn.restype = ctypes.c_int
        lib.monarch_tf_stats_json.argtypes = [ctypes.POINTER(ctypes.c_void_p)] * 2
        lib.monarch_tf_wait_for_placement.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.monarch_tf_free.argtypes = [ctypes.c_void_p]
        lib.monarch_tf_free.restype = None
        _lib = lib
        return path


def configure(config_path=None, dataset=None):
    """Points the plugin at a YAML config (MONARCH_CONFIG) or, with only
    `dataset`, at the embedded default over that directory (MONARCH_DATASET).
    Takes effect only before the first monarch:// access of the process."""
    if config_path is not None:
        os.environ["MONARCH_CONFIG"] = os.path.abspath(config_path)
    if dataset is not None:
        os.environ["MONARCH_DATASET"] = os.path.abspath(dataset)


def uri(path):
    """monarch:// URI of a local path: uri("/data/set/a") == "monarch:///data/set/a"."""
    return "monarch://" + os.path.abspath(path)


def _take_string(ptr):
    if not ptr:
        return ""
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        _lib.monarch_tf_free(ptr)


def _raise(code, error):
    import tensorflow as tf
    by_code = {
        tf.errors.CANCELLED: tf.errors.CancelledError,
        tf.errors.INVALID_ARGUMENT: tf.errors.InvalidArgumentError,
        tf.errors.NOT_FOUND: tf.errors.NotFoundError,
        tf.errors.PERMISSION_DENIED: tf.errors.PermissionDeniedError,
        tf.errors.RESOURCE_EXHAUSTED: tf.errors.ResourceExhaustedError,
        tf.errors.FAILED_PRECONDITION: tf.errors.FailedPreconditionError,
        tf.errors.UNAVAILABLE: tf.errors.UnavailableError,
        tf.errors.INTERNAL: tf.errors.InternalError,
    }
    raise by_code.get(code, tf.errors.UnknownError)(None, None, error)


def _call(fn, *outs):
    if _lib is None:
        register()
    error = ctypes.c_void_p()
    code = getattr(_lib, fn)(*[ctypes.byref(o) for o in outs], ctypes.byref(error))
    message = _take_string(error)
    if code != 0:
        _raise(code, message)


def stats():
    """Monarch's counters for this process's instance as a dict (the JSON of
    monarch_stats_json: "tiers" fastest first with the source last, plus the
    promotion counters). Opens the instance if nothing was read yet."""
    out = ctypes.c_void_p()
    _call("monarch_tf_stats_json", out)
    return json.loads(_take_string(out))


def wait_for_placement():
    """Blocks until Monarch has no promotion queued or running."""
    _call("monarch_tf_wait_for_placement")
