"""Fixtures for the HTML report tests: a headless Chromium driven over the DevTools protocol
(stdlib only: `--remote-debugging-pipe`), and realistic CompareResults built by hand."""
from __future__ import annotations

import base64
import fcntl
import json
import math
import os
import queue
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from opdiff.comparison.result import (ERROR, PASS, UNMATCHED, WARNING, CompareResult, Divergence,
                                      TensorRow)
from opdiff.store.schema import Location

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"),
                             shutil.which("google-chrome")) if p), None)


class Chromium:
    """One headless browser; `open(path)` loads a page in a fresh tab and returns a Page."""

    def __init__(self, exe: str, profile: Path):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def child_fds():  # the pipe protocol: Chromium reads commands on fd 3, writes on fd 4
            a = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-extensions", "--hide-scrollbars", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=child_fds)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id = 0
        self._responses: dict[int, dict] = {}
        self.events: list[dict] = []
        self._inbox: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        while True:
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                self._inbox.put(None)
                return
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for m in messages:
                self._inbox.put(json.loads(m))

    def _pump(self, timeout: float) -> None:
        msg = self._inbox.get(timeout=timeout)
        if msg is None:
            raise RuntimeError("chromium closed the DevTools pipe")
        if "id" in msg:
            self._responses[msg["id"]] = msg
        else:
            self.events.append(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict:
        self._next_id += 1
        mid = self._next_id
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while mid not in self._responses:
            self._pump(max(0.01, deadline - time.monotonic()))
        reply = self._responses.pop(mid)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, method: str, session: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for ev in self.events[seen:]:
                if ev.get("method") == method and ev.get("sessionId") == session:
                    self.events.remove(ev)
                    return ev
            seen = len(self.events)
            self._pump(max(0.01, deadline - time.monotonic()))

    def open(self, path: Path, width: int = 1280, height: int = 900) -> "Page":
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, target, session)
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                  "deviceScaleFactor": 1, "mobile": False}, session=session)
        start = time.perf_counter()
        self.send("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=session)
        self.wait_event("Page.loadEventFired", session)
        page.wait_for("document.documentElement.getAttribute('data-opdiff-ready') !== null")
        page.load_seconds = time.perf_counter() - start
        return page

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)


class Page:
    def __init__(self, browser: Chromium, target: str, session: str):
        self.browser, self.target, self.session = browser, target, session
        self.load_seconds = math.nan

    def eval(self, expression: str):
        res = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                     "awaitPromise": True}, session=self.session)
        if "exceptionDetails" in res:
            raise AssertionError(f"page script failed: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.eval(f"!!({expression})"):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {expression}; errors: {self.errors()}")
            time.sleep(0.05)

    def errors(self) -> list[str]:
        """JavaScript exceptions, console.error calls and browser error log entries of this tab."""
        out = []
        for ev in self.browser.events:
            if ev.get("sessionId") != self.session:
                continue
            p = ev.get("params", {})
            if ev["method"] == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
            elif ev["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console.error: " + " ".join(str(a.get("value", a.get("description")))
                                                        for a in p.get("args", [])))
            elif ev["method"] == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params = {"format": "png"}
        if full_page:
            size = self.browser.send("Page.getLayoutMetrics", session=self.session)["cssContentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        data = self.browser.send("Page.captureScreenshot", params, session=self.session)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        self.browser.send("Target.closeTarget", {"targetId": self.target})


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium); the browser checks need it")
    b = Chromium(CHROMIUM, tmp_path_factory.mktemp("chromium-profile"))
    try:
        b.send("Browser.getVersion", timeout=60)
        yield b
    finally:
        b.close()


# ---------------------------------------------------------------------------------------------
# Hand-built compare results shaped like a real one: a small ResNet, forward and backward, bf16
# target against fp32 golden, with one planted culprit whose error then spreads downstream.

_row = TensorRow


def _metrics(err: float, numel: int, rng: random.Random) -> dict:
    return {"Cosine": round(1 - err * err / 2, 12), "RMSE": err * 0.8, "MAPE": err * 130,
            "MaxAbsErr": err * rng.uniform(3, 9), "MaxRelativeErr": err * rng.uniform(5, 60),
            "MeanRelativeErr": err * 1.2, "RelEuclideanDistance": err, "KLD": err * err / 3,
            "One Thousandth Err Ratio": max(0.0, 1 - err * 90), "Five Thousandths Err Ratio": max(0.0, 1 - err * 20)}


def _stats(scale: float, rng: random.Random) -> dict:
    return {"max": scale * rng.uniform(2, 4), "min": -scale * rng.uniform(2, 4),
            "mean": scale * rng.uniform(-0.1, 0.1), "norm": scale * rng.uniform(20, 40), "nan": 0, "inf": 0}


def _verdict(err: float) -> tuple[str, str, str]:
    if err > 1e-2:
        return ERROR, "No", f"relative error {err:.2e} exceeds the bfloat16 tolerance 1.0e-02"
    if err > 6e-3:
        return WARNING, "Yes", f"relative error {err:.2e} is close to the bfloat16 tolerance 1.0e-02"
    return PASS, "Yes", f"relative error {err:.2e} is within the bfloat16 tolerance 1.0e-02"


def build_cnn_result(culprit_path: str = "layer2.0.conv2", culprit_phase: str = "forward",
                     evil: str | None = None, seed: int = 0) -> CompareResult:
    """A ResNet-ish compare: ~400 rows, one culprit conv, error spreading after it.

    `evil` (a hostile string) is planted in op names, a module name, a stack and the source code.
    """
    rng = random.Random(seed)
    src = "/home/user/project/models/resnet.py"
    blocks = [("layer1.0", False), ("layer1.1", False), ("layer2.0", True), ("layer2.1", False)]
    leaves = [("conv1", "Conv2d", "Functional.conv2d", 12), ("bn1", "BatchNorm2d", "Functional.batch_norm", 13),
              ("relu", "ReLU", "Functional.relu", 14), ("maxpool", "MaxPool2d", "Functional.max_pool2d", 15)]
    for b, down in blocks:
        leaves += [(f"{b}.conv1", "Conv2d", "Functional.conv2d", 41),
                   (f"{b}.bn1", "BatchNorm2d", "Functional.batch_norm", 42),
                   (f"{b}.relu", "ReLU", "Functional.relu", 43), (f"{b}.conv2", "Conv2d", "Functional.conv2d", 44),
                   (f"{b}.bn2", "BatchNorm2d", "Functional.batch_norm", 45)]
        if down:
            leaves += [(f"{b}.downsample.0", "Conv2d", "Functional.conv2d", 47),
                       (f"{b}.downsample.1", "BatchNorm2d", "Functional.batch_norm", 47)]
        leaves += [(b, "BasicBlock", "Tensor.__iadd__", 48), (b, "BasicBlock", "Functional.relu", 49)]
    leaves += [("avgpool", "AdaptiveAvgPool2d", "Functional.adaptive_avg_pool2d", 18),
               ("fc", "Linear", "Functional.linear", 20)]
    if evil:
        leaves.insert(8, (f"layer1.0.{evil}", "Conv2d", f"Functional.{evil}", 41))

    rows, counters, index = [], {}, 0
    err_in, culprit, culprit_stack = 2e-3, None, None
    forward_ops = []

    def add_op(op, call, phase, kind, module, stack, tensors):
        nonlocal index
        name = f"{op}.{call}.{phase}" if kind != "module" else f"{op}.{phase}.{call}"
        if kind == "param_grad":
            name = f"{op}.parameters_grad.{call}"
        for tail, role, err, dtype, shape in tensors:
            result, acc, reason = _verdict(err)
            tname = f"{name}.{tail}"
            rows.append(_row(target_name=tname, golden_name=tname, op_name=name, role=role, phase=phase,
                             kind=kind, index=index, target_dtype=dtype, golden_dtype="float32",
                             target_shape=shape, golden_shape=shape, metrics=_metrics(err, 1024, rng),
                             target_stats=_stats(1 + err, rng), golden_stats=_stats(1.0, rng),
                             result=result, accuracy_reached=acc, reason=reason, module=module,
                             stack=stack or (), error=err, scale_error=err * 0.3))
        index += 1
        return name

    def stack_for(line, code):
        return (Location(src, line, code, "forward"),
                Location("/home/user/project/train.py", 88, "logits = model(images)", "train_step"))

    for path, cls, fn, line in leaves:
        call = counters[fn] = counters.get(fn, -1) + 1
        is_block_op = cls == "BasicBlock"
        module_call = f"Module.{path}.{cls}.forward.0"
        code = f"out = self.{path.rsplit('.', 1)[-1]}(out)" if not is_block_op else (
            "out += identity" if fn == "Tensor.__iadd__" else "out = self.relu(out)")
        if evil and evil in path:
            code = f"x = {evil}"
        stack = stack_for(line, code) if not (evil and evil in path) else (
            Location(f"/tmp/{evil}.py", line, code, evil),)
        is_culprit = path == culprit_path and culprit is None and culprit_phase == "forward"
        noise = rng.uniform(1.5e-3, 4e-3)        # bf16 rounding: independent per op
        err_out = 5e-2 if is_culprit else max(err_in * rng.uniform(0.9, 1.05), noise) if culprit else noise
        shape = [8, 64, 16, 16]
        tensors = [("input.0", "input", err_in, "bfloat16", shape)]
        if fn in ("Functional.conv2d", "Functional.linear"):
            tensors.append(("input.1", "input", rng.uniform(1e-3, 2e-3), "bfloat16", [64, 64, 3, 3]))
        tensors.append(("output.0", "output", err_out, "bfloat16", shape))
        name = add_op(fn, call, "forward", "api", module_call, stack, tensors)
        forward_ops.append((fn, call, module_call, stack, err_in, err_out, path, cls))
        if is_culprit:
            culprit, culprit_stack, culprit_in = name, stack, err_in
        if not is_block_op:
            add_op(f"Module.{path}.{cls}", 0, "forward", "module", None, stack,
                   [("input.0", "input", err_in, "bfloat16", shape),
                    ("output.0", "output", err_out, "bfloat16", shape)])
        err_in = err_out
    # the loss, outside any module
    add_op("Functional.cross_entropy", 0, "forward", "api", None,
           (Location("/home/user/project/train.py", 89, "loss = F.cross_entropy(logits, labels)", "train_step"),),
           [("input.0", "input", err_in, "float32", [8, 10]), ("output.0", "output", err_in * 0.5, "float32", [])])
    # backward, in reverse: gradients carry the forward's error
    g_err = err_in
    for fn, call, module_call, stack, _, _, path, cls in reversed(forward_ops):
        out_err = g_err * rng.uniform(0.9, 1.1)
        if culprit_phase == "backward" and path == culprit_path and culprit is None:
            out_err = 8e-2
        shape = [8, 64, 16, 16]
        name = add_op(fn, call, "backward", "api", module_call, stack,
                      [("input.0", "input", g_err, "bfloat16", shape),
                       ("output.0", "output", out_err, "bfloat16", shape)])
        if culprit_phase == "backward" and path == culprit_path and culprit is None:
            culprit, culprit_stack, culprit_in = name, stack, g_err
        if cls in ("Conv2d", "BatchNorm2d", "Linear"):
            add_op(f"Module.{path}.{cls}", 0, "backward", "param_grad", None, None,
                   [("weight", "parameters", out_err * 1.1, "float32", [64, 64, 3, 3]),
                    ("bias", "parameters", out_err * 0.9, "float32", [64])])
        g_err = out_err
    # one op the golden run has and the target does not
    rows.append(_row(target_name=None, golden_name="Tensor.contiguous.0.forward.output.0",
                     op_name="Tensor.contiguous.0.forward", role="output", phase="forward", kind="api",
                     index=5, golden_dtype="float32", golden_shape=[8, 64, 16, 16], result=UNMATCHED,
                     reason="only in golden: no target tensor of this name"))

    lines = {41: "        out = self.conv1(x)", 42: "        out = self.bn1(out)", 43: "        out = self.relu(out)",
             44: "        out = self.conv2(out)", 45: "        out = self.bn2(out)", 46: "",
             47: "        identity = self.downsample(x)"}
    loc = culprit_stack[0]
    div = Divergence(
        name=culprit, op=culprit.rsplit(".", 2)[0], phase=culprit_phase,
        reason=(f"its inputs agree with golden (relative error {culprit_in:.1e}) but its output is "
                f"off by 5.0e-02, above the bfloat16 tolerance 1.0e-02"),
        location=loc, metrics=_metrics(5e-2, 1024, rng), tensor=f"{culprit}.output.0",
        input_metrics=_metrics(culprit_in, 1024, rng), module=f"Module.{culprit_path}.Conv2d.forward.0",
        step=0, rank=0,
        context=tuple((n, lines.get(n, "")) for n in range(loc.line - 2, loc.line + 3)) if not evil else
        ((loc.line, loc.code), (loc.line + 1, f"# {evil}")))
    counts = {k: sum(r.result == k for r in rows) for k in (PASS, WARNING, ERROR, UNMATCHED)}
    result = CompareResult(
        target="./dump/npu_bf16/step0/rank0", golden="./dump/cpu_fp32/step0/rank0", rows=rows,
        first_divergence=div, counts=counts, step=0, rank=0,
        environment_diff=[{"key": "torch", "target": "2.5.1", "golden": "2.13.0+cpu"},
                          {"key": "device", "target": "npu:0 (Ascend910B)", "golden": "cpu"},
                          {"key": "autocast", "target": "bfloat16", "golden": "off"}],
        files={"csv": "/out/compare_result_20250101_120000.csv", "summary": "/out/summary.json"})
    return result


def build_large_result(n_rows: int, seed: int = 1) -> CompareResult:
    """A long transformer-like run: n_rows tensors, errors creeping up, one culprit in the middle."""
    rng = random.Random(seed)
    rows = []
    ops = ["Functional.linear", "Functional.layer_norm", "Torch.matmul", "Functional.softmax",
           "Tensor.__add__", "Functional.gelu", "Functional.dropout"]
    culprit_at = n_rows // 3
    culprit = None
    counters: dict = {}
    n_ops = -(-n_rows // 3)
    for i in range(n_ops):
        phase = "forward" if i < n_ops * 0.55 else "backward"
        fn = ops[i % len(ops)]
        call = counters[(fn, phase)] = counters.get((fn, phase), -1) + 1
        layer = (i // 40) % 48
        module = f"Module.layers.{layer}.TransformerBlock.forward.0"
        name = f"{fn}.{call}.{phase}"
        base = 2e-3 * (1 + i / n_ops)
        for tail, role in (("input.0", "input"), ("input.1", "input"), ("output.0", "output")):
            j = len(rows)
            if j == n_rows:
                break
            err = base * rng.uniform(0.5, 1.5)
            if j >= culprit_at:
                err = max(err, 2e-2 * rng.uniform(0.8, 1.5))
            if culprit is None and j >= culprit_at and role == "output":
                culprit = name
            result, acc, reason = _verdict(err)
            tname = f"{name}.{tail}"
            rows.append(_row(target_name=tname, golden_name=tname, op_name=name, role=role, phase=phase,
                             kind="api", index=i, target_dtype="bfloat16", golden_dtype="float32",
                             target_shape=[4, 128, 512], golden_shape=[4, 128, 512],
                             metrics=_metrics(err, 4096, rng), target_stats=_stats(1 + err, rng),
                             golden_stats=_stats(1.0, rng), result=result, accuracy_reached=acc,
                             reason=reason, module=module,
                             stack=(Location("/home/user/llm/model.py", 100 + i % 50, "h = self.mlp(h)", "forward"),),
                             error=err))
    div = Divergence(name=culprit, op=culprit.rsplit(".", 2)[0], phase="forward",
                     reason="its inputs agree with golden but its output does not", location=None,
                     metrics={"Cosine": 0.9998}, tensor=f"{culprit}.output.0")
    counts = {k: sum(r.result == k for r in rows) for k in (PASS, WARNING, ERROR, UNMATCHED)}
    return CompareResult(target="./dump/a", golden="./dump/b", rows=rows, first_divergence=div, counts=counts)


@pytest.fixture(scope="session")
def cnn_result():
    return build_cnn_result


@pytest.fixture(scope="session")
def large_result():
    return build_large_result


@pytest.fixture(scope="session")
def fifty_k(tmp_path_factory):
    """A 50k-row report written once for the session: (result, path, CPU seconds to write it)."""
    from opdiff.report.html import write_html

    result = build_large_result(50_000)
    start = time.process_time()
    path = write_html(result, tmp_path_factory.mktemp("fifty_k") / "report.html")
    return result, path, time.process_time() - start
