"""A client of tided written only from docs/protocol.md: pyzmq (libzmq) and JSON, no tide code.

Shared by the daemon tests: starting a real tided, requests on its command socket,
events from its event socket.
"""
import json
import os
import time

import zmq

from tided_process import Tided  # noqa: F401 (the daemon tests take it from here)

PROTOCOL = 1


class Conn:
    """A DEALER on the command socket: one JSON frame out, one JSON frame back."""

    def __init__(self, endpoint, ctx=None, curve=None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        set_curve(self.sock, curve)
        self.sock.connect(endpoint)
        self.next_id = 0

    def raw(self, frames, timeout=10.0):
        """Sends frames as they are; returns the parsed reply, or None if none came.

        The send is bounded too: a DEALER whose connection failed its handshake (a key the
        daemon refuses, no CURVE at all) may have no pipe left, and a blocking send to no
        pipe waits forever. Whether the pipe is gone when the send comes is a race with
        libzmq's I/O thread, lost on a loaded machine (CI's daemon.security timed out so).
        """
        try:
            self.sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            if not self.sock.poll(int(timeout * 1000), zmq.POLLOUT):
                return None
            self.sock.send_multipart(frames, flags=zmq.NOBLOCK)
        if not self.sock.poll(int(timeout * 1000)):
            return None
        parts = self.sock.recv_multipart()
        return json.loads(parts[-1])

    def request(self, type_, body=None, ok=True, timeout=10.0):
        self.next_id += 1
        msg = {"v": PROTOCOL, "id": self.next_id, "type": type_, "body": body or {}}
        reply = self.raw([json.dumps(msg).encode()], timeout)
        assert reply is not None, f"no reply to {type_} within {timeout} s"
        assert reply["id"] == self.next_id, reply
        if ok is None:  # either answer: the caller looks
            return reply
        if ok:
            assert reply["ok"], f"{type_} {body}: {reply.get('error')}"
            return reply["body"]
        assert not reply["ok"], f"{type_} {body} should have failed: {reply}"
        return reply["error"]

    def close(self):
        self.sock.close()


class Events:
    """A SUB on the event socket, collecting every event it receives."""

    def __init__(self, endpoint, prefix="", ctx=None, curve=None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        set_curve(self.sock, curve)
        self.sock.setsockopt_string(zmq.SUBSCRIBE, prefix)
        self.sock.connect(endpoint)
        self.seen = []

    def pump(self, timeout=0.05):
        while self.sock.poll(int(timeout * 1000)):
            topic, body = self.sock.recv_multipart()
            event = json.loads(body)
            event["topic"] = topic.decode()
            self.seen.append(event)
            timeout = 0

    def wait_for(self, pred, timeout=60.0, what="event"):
        deadline = time.time() + timeout
        checked = 0
        while time.time() < deadline:
            self.pump(0.1)
            for e in self.seen[checked:]:
                if pred(e):
                    return e
            checked = len(self.seen)
        raise AssertionError(f"no {what} within {timeout} s; last events: {[summary(e) for e in self.seen[-8:]]}")

    def states(self, run):
        return [e["body"]["state"] for e in self.seen
                if e["run"] == run and e["kind"] == "state" and not e.get("snapshot")]

    def close(self):
        self.sock.close()


def set_curve(sock, curve):
    """curve: (server public key, client public key, client secret key), Z85 bytes, or None."""
    if curve:
        sock.setsockopt(zmq.CURVE_SERVERKEY, curve[0])
        sock.setsockopt(zmq.CURVE_PUBLICKEY, curve[1])
        sock.setsockopt(zmq.CURVE_SECRETKEY, curve[2])


def summary(e):
    return f"{e['topic']}#{e['seq']} {json.dumps(e['body'])[:120]}"


def is_state(run, state):
    return lambda e: e["run"] == run and e["kind"] == "state" and e["body"]["state"] == state


def wait_status(conn, run, pred, timeout=120.0, what="state"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = conn.request("status", {"run": run})["run"]
        if pred(r):
            return r
        time.sleep(0.05)
    raise AssertionError(f"run {run}: no {what} within {timeout} s; last status: {r['state']} step {r['last_step']}")


def losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f]
