# Written by inferd for replicas of protocol "potassium"; do not edit (it is
# rewritten at every replica start).
#
# Python imports sitecustomize at start-up from the first sys.path entry that has
# one; inferd puts this file's directory first on PYTHONPATH. An unmodified
# Potassium app calls app.serve(), which binds 0.0.0.0:8000. This shim turns any
# bind to port 8000 (whatever the host) into a bind to 127.0.0.1:$PORT, so that
# several replicas can run side by side and each listens where inferd expects.
import os
import socket

_TARGET = 8000


def _install():
    try:
        port = int(os.environ["PORT"])
    except (KeyError, ValueError):
        return
    orig_bind = socket.socket.bind

    def bind(self, address):
        if isinstance(address, tuple) and len(address) >= 2 and address[1] == _TARGET:
            if self.family == socket.AF_INET:
                address = ("127.0.0.1", port)
            elif self.family == socket.AF_INET6:
                # inferd connects to 127.0.0.1: take it as a v4-mapped address.
                try:
                    self.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                except OSError:
                    pass
                address = ("::ffff:127.0.0.1", port) + tuple(address[2:])
        return orig_bind(self, address)

    socket.socket.bind = bind


def _chain():
    # Run the sitecustomize this one shadows, if any (from the rest of sys.path).
    import importlib.machinery
    import importlib.util
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)


_install()
try:
    _chain()
except Exception as e:  # a broken user sitecustomize must not stop the model
    import sys

    print("inferd potassium shim: running the shadowed sitecustomize failed: %r" % (e,), file=sys.stderr)
