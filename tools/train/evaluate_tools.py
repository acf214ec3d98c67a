# SPDX-License-Identifier: MIT
#
# evaluate_tools.py -- tool-call accuracy of a model, measured end to end through `lockstep
# serve` (its chat template, greedy decoding and tool-call parser) on held-out conversations
# (toolcall_data.heldout_set: cities, numbers, glossary terms and tool results that no training
# conversation contains):
#
#   call    the reply to [system?, user] with the tools is exactly one tool call
#           (finish_reason "tool_calls") to the right tool with the right arguments;
#   parsed  ... is a tool call at all (any tool, any arguments);
#   answer  after the model's own call and the tool's result, the final answer contains the
#           result verbatim (finish_reason "stop");
#   mtp     with --spec mtp the replies are identical, and the drafts' acceptance.
#
# Usage: /usr/bin/python3 tools/train/evaluate_tools.py LOCKSTEP MODEL_DIR [--n 100] [--out F]

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import toolcall_data as td  # noqa: E402


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


class Server:
    def __init__(self, lockstep, model, port, extra):
        try:
            urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2)
            sys.exit("evaluate_tools: something already answers on port %d" % port)
        except OSError:
            pass
        self.log = tempfile.TemporaryFile()
        self.p = subprocess.Popen([lockstep, "serve", "--model", model, "--port", str(port),
                                   "--threads", "2", "--max-slots", "8"] + extra,
                                  stdout=self.log, stderr=subprocess.STDOUT)
        self.base = "http://127.0.0.1:%d" % port
        for _ in range(600):
            try:
                urllib.request.urlopen(self.base + "/health", timeout=2)
                with urllib.request.urlopen(self.base + "/v1/models", timeout=10) as r:
                    self.model_id = json.loads(r.read())["data"][0]["id"]
                return
            except Exception:
                if self.p.poll() is not None:
                    break
                time.sleep(0.1)
        self.log.seek(0)
        sys.exit("evaluate_tools: the server did not start:\n" + self.log.read().decode())

    def metrics(self):
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self):
        self.p.terminate()
        self.p.wait()


def one(s, c):
    """Both turns of one held-out conversation; returns the record."""
    msgs = [m for m in c["messages"] if m["role"] in ("system", "user")]
    base = s.base
    body = {"model": s.model_id, "messages": msgs, "tools": c["tools"], "temperature": 0,
            "max_tokens": 64}
    r1 = post(base, "/v1/chat/completions", body)
    m1 = r1["choices"][0]["message"]
    calls = m1.get("tool_calls") or []
    rec = {"prompt": msgs[-1]["content"], "want": c["call"], "content": m1.get("content"),
           "tool_calls": calls, "finish": r1["choices"][0]["finish_reason"]}
    rec["parsed"] = len(calls) > 0
    ok = False
    if len(calls) == 1 and rec["finish"] == "tool_calls":
        f = calls[0]["function"]
        try:
            args = json.loads(f["arguments"])
        except ValueError:
            args = None
        rec["right_tool"] = f["name"] == c["call"]["name"]
        ok = rec["right_tool"] and args == c["call"]["arguments"]
    rec["call_ok"] = ok
    rec["answer_ok"] = False
    if ok:
        conv = msgs + [{"role": "assistant", "content": m1.get("content"), "tool_calls": calls},
                       {"role": "tool", "tool_call_id": calls[0]["id"], "content": c["result"]}]
        r2 = post(base, "/v1/chat/completions", dict(body, messages=conv))
        m2 = r2["choices"][0]["message"]
        rec["answer"] = m2.get("content")
        rec["answer_finish"] = r2["choices"][0]["finish_reason"]
        rec["answer_ok"] = (c["result"] in (m2.get("content") or "")
                            and rec["answer_finish"] == "stop")
    return rec


def run_all(s, convs):
    with cf.ThreadPoolExecutor(8) as ex:
        return list(ex.map(lambda c: one(s, c), convs))


def acceptance(metrics):
    """Drafts accepted / proposed, from /metrics."""
    prop = acc = 0.0
    for line in metrics.splitlines():
        if line.startswith("lockstep_spec_drafts_proposed_total"):
            prop += float(line.split()[-1])
        elif line.startswith("lockstep_spec_drafts_accepted_total"):
            acc += float(line.split()[-1])
    return acc / prop if prop else None


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("lockstep")
    p.add_argument("model")
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--port", type=int, default=39711)
    p.add_argument("--out")
    p.add_argument("--no-mtp", action="store_true")
    a = p.parse_args(argv)
    convs = td.heldout_set(a.n)
    t0 = time.time()
    s = Server(a.lockstep, a.model, a.port, [])
    try:
        recs = run_all(s, convs)
    finally:
        s.stop()
    wall = time.time() - t0
    n = len(recs)
    res = {"n": n, "parsed": sum(r["parsed"] for r in recs) / n,
           "right_tool": sum(bool(r.get("right_tool")) for r in recs) / n,
           "call": sum(r["call_ok"] for r in recs) / n,
           "answer": sum(r["answer_ok"] for r in recs) / n,
           "by_tool": {}, "seconds": round(wall, 1)}
    for t in sorted(td.TOOLS):
        rs = [r for r in recs if r["want"]["name"] == t]
        res["by_tool"][t] = {"n": len(rs), "call": sum(r["call_ok"] for r in rs) / len(rs),
                             "answer": sum(r["answer_ok"] for r in rs) / len(rs)}
    print("tool-call accuracy on %d held-out prompts: parsed as a call %.3f, right tool %.3f, "
          "right tool and arguments %.3f; answer contains the result %.3f (%.0f s)"
          % (n, res["parsed"], res["right_tool"], res["call"], res["answer"], wall))
    for t, v in res["by_tool"].items():
        print("  %-12s n %3d  call %.3f  answer %.3f" % (t, v["n"], v["call"], v["answer"]))
    for r in recs:
        if not r["call_ok"] or not r["answer_ok"]:
            print("  miss: %r -> %s %s | %r" % (r["prompt"], json.dumps(r["tool_calls"])[:160],
                                                 repr(r["content"])[:80], r.get("answer")))
    if not a.no_mtp:
        s = Server(a.lockstep, a.model, a.port, ["--spec", "mtp", "-k", "3", "--spec-gate",
                                                 "false"])
        try:
            recs2 = run_all(s, convs)
            res["mtp_acceptance"] = acceptance(s.metrics())
        finally:
            s.stop()
        strip = lambda r: {k: v for k, v in r.items() if k != "tool_calls"} | {
            "tool_calls": [c["function"] for c in r["tool_calls"]]}
        res["mtp_identical"] = all(strip(x) == strip(y) for x, y in zip(recs, recs2))
        print("with --spec mtp -k 3: replies identical %s, drafts accepted %s"
              % (res["mtp_identical"], res["mtp_acceptance"]))
    res["records"] = recs
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
