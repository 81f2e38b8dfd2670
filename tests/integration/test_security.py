#!/usr/bin/env python3
"""radixd's security defaults (SECURITY.md):

- with no [server] host, radixd binds 127.0.0.1 (the ready line says so and
  the port is not reachable on another local address);
- [server] admin_api_key: admin endpoints (/flush_cache, the expert
  distribution record) need it -- no key or a wrong one 401 with
  WWW-Authenticate, the API key alone 403 -- and it also opens the API
  endpoints; /health needs no key;
- a plugin radixd would load from a directory writable by others, or a
  plugin file writable by others: radixd exits non-zero before "ready",
  with one line naming the file, the directory and the mode.
Each test starts its own daemon on the "tiny" model."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rxtest import Daemon, diag, eq, expect, expect_error, model, run, short, test  # noqa: E402

KEY, ADMIN = "api-secret", "admin-secret"


def _other_local_ip():
    """A local address other than 127.0.0.1, or None."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))   # TEST-NET: nothing is sent for UDP connect
        ip = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return ip if ip and not ip.startswith("127.") else None


@test
def test_default_bind_is_loopback():
    d = Daemon("tiny", name="bind", sections={"server": {"host": None}}).start()
    try:
        expect("http://127.0.0.1:%d" % d.port in d.ready_line, "ready line: %r" % d.ready_line)
        ip = _other_local_ip()
        if ip is None:
            diag("no non-loopback address here: only the ready line checked")
            return
        s = socket.socket()
        s.settimeout(2)
        try:
            rc = s.connect_ex((ip, d.port))
        finally:
            s.close()
        expect(rc != 0, "radixd with no [server] host accepted a connection on %s:%d" % (ip, d.port))
    finally:
        d.close()


@test
def test_admin_key():
    d = Daemon("tiny", name="admin", sections={"server": {"api_key": KEY, "admin_api_key": ADMIN}}).start()
    try:
        api = {"Authorization": "Bearer " + KEY}
        adm = {"Authorization": "Bearer " + ADMIN}
        none = {"Authorization": ""}
        for path in ("/flush_cache", "/start_expert_distribution_record"):
            r = d.post(path, headers=none)
            expect_error(r, 401, what="%s without a key" % path)
            expect(r.header("WWW-Authenticate") == "Bearer", "401 without WWW-Authenticate: Bearer")
            expect_error(d.post(path, headers={"Authorization": "Bearer " + KEY + "x"}), 401,
                         what="%s with a wrong key" % path)
            r = d.post(path, headers=api)
            e = expect_error(r, 403, what="%s with the API key only" % path)
            expect("admin_api_key" in short(e, 2000), "the 403 does not name admin_api_key: %s" % short(e))
        eq(d.post("/flush_cache", headers=adm).status, 200, "/flush_cache with the admin key")
        # the API endpoints take either key; /health none
        body = {"prompt": "hi", "max_tokens": 2}
        eq(d.post("/v1/completions", body, headers=api).status, 200, "completion with the API key")
        eq(d.post("/v1/completions", body, headers=adm).status, 200, "completion with the admin key")
        expect_error(d.post("/v1/completions", body, headers=none), 401, what="completion without a key")
        eq(d.get("/health", headers=none).status, 200, "/health without a key")
        eq(d.get("/metrics", headers=api).status, 200, "/metrics with the API key")
    finally:
        d.close()


def _radixd_fails(plugin_dir, what):
    """Run radixd on the tiny model with [plugins] path = plugin_dir:
    it must exit non-zero without "ready"; returns its output."""
    tmp = tempfile.mkdtemp(prefix="rx-sec-")
    ini = os.path.join(tmp, "radixd.ini")
    with open(ini, "w") as f:
        f.write("[server]\nport = 0\n[log]\nfile = -\n[plugins]\npath = %s\n[model]\npath = %s\n"
                "[kernels]\nbackend = cpu\nthreads = 1\n[cache]\nkv_memory = 16MiB\n" % (plugin_dir, model("tiny")))
    env = dict(os.environ, RADIX_PLUGIN_PATH="")
    try:
        p = subprocess.run([os.environ["RADIXD"], "-c", ini], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, env=env, timeout=60)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = p.stdout.decode("utf-8", "replace")
    expect(p.returncode != 0, "%s: radixd exited 0; output:\n%s" % (what, short(out, 2000)))
    expect("ready on" not in out, "%s: radixd got ready; output:\n%s" % (what, short(out, 2000)))
    return out


def _plugin_copy(dir_mode, file_mode, link=False):
    """A temp dir with every built plugin (copies, or links to the build
    tree's files); returns (dir, kernels-cpu path there)."""
    src = os.environ["RX_PLUGIN_BUILD_DIR"]
    d = tempfile.mkdtemp(prefix="rx-plugins-")
    for name in os.listdir(src):
        real = os.path.realpath(os.path.join(src, name))
        if link:
            os.symlink(real, os.path.join(d, name))
        else:
            shutil.copy(real, os.path.join(d, name))
            os.chmod(os.path.join(d, name), 0o644)
    k = os.path.join(d, "kernels-cpu.so")
    if file_mode is not None:
        os.chmod(k, file_mode)
    os.chmod(d, dir_mode)
    return d, k


@test
def test_plugin_dir_writable_by_others_refused():
    d, _ = _plugin_copy(0o777, None, link=True)
    try:
        out = _radixd_fails(d, "plugin directory mode 0777")
        expect("writable by others" in out and d in out and "mode 0777" in out,
               "the refusal does not name the directory and its mode:\n%s" % short(out, 2000))
        diag([ln for ln in out.splitlines() if "writable by others" in ln][0][-200:])
    finally:
        os.chmod(d, 0o755)
        shutil.rmtree(d, ignore_errors=True)


@test
def test_plugin_file_writable_by_others_refused():
    d, k = _plugin_copy(0o755, 0o666)
    try:
        out = _radixd_fails(d, "kernels-cpu.so mode 0666")
        expect("file writable by others" in out and k in out and "mode 0666" in out,
               "the refusal does not name the file and its mode:\n%s" % short(out, 2000))
    finally:
        shutil.rmtree(d, ignore_errors=True)


@test
def test_safe_plugin_copy_loads():
    # the same layout with safe modes starts: the refusals above are the modes'
    d, _ = _plugin_copy(0o755, 0o644)
    try:
        dm = Daemon("tiny", name="safe-plugins", sections={"plugins": {"path": d}}).start()
        eq(dm.get("/health").status, 200, "/health with plugins from a safe copy")
        dm.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    run(None, timeout=150)
