"""dmae-serve answers for a fixed seed and --first-index (PREDICT, CERTIFY, sequential CERTIFY) -> JSON.

    python bench/experiments/2026-11-26-refactor-identity/serve_answers.py OUT.json
"""

import http.client
import json
import socket
import subprocess
import sys
import time

from dmae_fast.data import demo_digits


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "dmae_fast.cli.serve", "--ckpt", "demo", "--device", "cpu",
                               "--port", str(port), "--seed", "99", "--first-index", "5", "--batch", "256",
                               "--body", "plain"], stderr=subprocess.DEVNULL)
    digits = demo_digits("test")
    images = [{"array": digits[i][0].tolist()} for i in range(3)]
    requests = [("predict", {"images": images, "n": 300}),
                ("certify", {"images": images, "n0": 40, "n": 400}),
                ("certify", {"images": images, "n0": 40, "n": 2000, "sequential": True})]
    answers = []
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        for kind, body in requests:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            connection.request("POST", f"/v1/{kind}", json.dumps(body), {"Content-Type": "application/json"})
            answers.append(json.loads(connection.getresponse().read()))
    finally:
        server.terminate()
        server.wait()
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump(answers, out, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
