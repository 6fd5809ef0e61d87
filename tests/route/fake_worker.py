"""fake_worker.py - a stand-in `orch serve` worker for the router tests that
sends exact, awkwardly split bytes (standard library only).

  GET  /health             200 {"status":"ok"}
  GET  /v1/models          one model, "fake"
  POST /v1/completions     stream true: STREAM (below), HTTP/1.1 chunked, in
                           pieces that cut events and lines in the middle and
                           put several events in one piece; prompt "cut": the
                           first two events and half of the third, then the
                           connection is dropped without the last chunk;
                           prompt "big": BIG (8 MiB of events), as fast as
                           the router takes it;
                           stream false: BODY with Retry-After: 7 and status
                           418 (an answer the router must pass on untouched)

Usage: python3 fake_worker.py PORTFILE   (binds 127.0.0.1:0, writes the port)
"""
import json
import socket
import socketserver
import sys
import time

EVENTS = [
    b'data: {"id":"fake-1","object":"text_completion","choices":[{"index":0,"text":"\\u00e9t\\u00e9","finish_reason":null}]}\n\n',
    b'data: {"id":"fake-1","object":"text_completion","choices":[{"index":0,"text":" two","finish_reason":null}]}\n\n',
    b'data: {"id":"fake-1","object":"text_completion","choices":[{"index":0,"text":"!","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6,"prompt_tokens_details":{"cached_tokens":2}}}\n\n',
    b"data: [DONE]\n\n",
]
STREAM = b"".join(EVENTS)
BIG = b"".join(b'data: {"n":%d,"pad":"%s"}\n\n' % (i, b"x" * 1000) for i in range(8000)) + b"data: [DONE]\n\n"
BODY = b'{"error":{"message":"I am a teapot","type":"invalid_request_error","param":null,"code":"teapot"}}'


def pieces(data):
    """Cut data at awkward places: 1, 7, 50, ... bytes."""
    sizes = [1, 7, 50, 3, 200, 11]
    out, i, k = [], 0, 0
    while i < len(data):
        n = sizes[k % len(sizes)]
        out.append(data[i:i + n])
        i += n
        k += 1
    return out


class Handler(socketserver.BaseRequestHandler):
    def read_request(self):
        f = self.request.makefile("rb")
        line = f.readline().decode()
        if not line:
            return None
        method, path, _ = line.split(" ", 2)
        headers = {}
        while True:
            h = f.readline().decode()
            if h in ("\r\n", "\n", ""):
                break
            k, v = h.split(":", 1)
            headers[k.strip().lower()] = v.strip()
        body = f.read(int(headers.get("content-length", "0")))
        return method, path, headers, body

    def send_simple(self, status, body, extra=b""):
        self.request.sendall(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n%s" % (status, len(body), extra, body))

    def handle(self):
        req = self.read_request()
        if not req:
            return
        method, path, headers, body = req
        if path == "/health":
            return self.send_simple(200, b'{"status":"ok"}')
        if path == "/v1/models":
            return self.send_simple(200, b'{"object":"list","data":[{"id":"fake","object":"model","owned_by":"test"}]}')
        obj = json.loads(body or b"{}")
        if not obj.get("stream"):
            return self.send_simple(418, BODY, b"Retry-After: 7\r\n")
        s = self.request
        s.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        data = STREAM
        if obj.get("prompt") == "big":
            for i in range(0, len(BIG), 65536):
                p = BIG[i:i + 65536]
                s.sendall(b"%x\r\n%s\r\n" % (len(p), p))
            s.sendall(b"0\r\n\r\n")
            return
        if obj.get("prompt") == "cut":
            data = EVENTS[0] + EVENTS[1] + EVENTS[2][:40]
        for p in pieces(data):
            s.sendall(b"%x\r\n%s\r\n" % (len(p), p))
            time.sleep(0.005)
        if obj.get("prompt") == "cut":
            time.sleep(0.05)
            s.shutdown(socket.SHUT_RDWR)  # no terminating chunk
            return
        s.sendall(b"0\r\n\r\n")


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    srv = Server(("127.0.0.1", 0), Handler)
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    import os
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    srv.serve_forever()
