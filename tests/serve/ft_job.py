"""ft_job.py PORT TRAIN.jsonl MODEL SEED EPOCHS BATCH_SIZE [LOAD_THREADS [STATUS]]
- upload TRAIN.jsonl (/v1/files), run one fine-tuning job on MODEL with the
seed and hyper-parameters given while LOAD_THREADS clients (default 0) keep
sending greedy completions to MODEL, wait for it to end in STATUS (default
succeeded; the job's error then goes in "error"), and print one
JSON line: the job id, fine_tuned_model, its event messages and whether every
completion during the job equalled the first (standard library only, for the
serve test suites)."""
import json
import sys
import threading
import time
import uuid

from client import post, request


def upload(port, path):
    b = uuid.uuid4().hex
    data = open(path, "rb").read()
    body = (("--%s\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n"
             "--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"t.jsonl\"\r\n"
             "Content-Type: application/jsonl\r\n\r\n") % (b, b)).encode() + data + \
        ("\r\n--%s--\r\n" % b).encode()
    st, _, out = request(port, "POST", "/v1/files", body,
                         {"Content-Type": "multipart/form-data; boundary=" + b})
    assert st == 200, out
    return json.loads(out)["id"]


def events(port, jid):
    ev, after = [], ""
    while True:  # every page, newest first
        page = json.loads(request(port, "GET", "/v1/fine_tuning/jobs/%s/events?limit=100%s"
                                  % (jid, "&after=" + after if after else ""))[2])
        ev += [e["message"] for e in page["data"]]
        if not page["has_more"]:
            return ev
        after = page["data"][-1]["id"]


def main():
    port, train, model = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    seed, epochs, batch = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    load = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    want = sys.argv[8] if len(sys.argv) > 8 else "succeeded"
    fid = upload(port, train)
    texts, stop = [], threading.Event()

    def infer():
        while not stop.is_set():
            st, js, _ = post(port, "/v1/completions",
                             {"model": model, "prompt": "And God said, ", "max_tokens": 16,
                              "temperature": 0})
            assert st == 200, js
            texts.append(js["choices"][0]["text"])

    threads = [threading.Thread(target=infer) for _ in range(load)]
    for t in threads:
        t.start()
    end = time.time() + 30
    while load and not texts and time.time() < end:  # the clients are running
        time.sleep(0.01)
    st, js, _ = post(port, "/v1/fine_tuning/jobs",
                     {"model": model, "training_file": fid, "seed": seed,
                      "hyperparameters": {"n_epochs": epochs, "batch_size": batch}})
    assert st == 200, js
    jid = js["id"]
    end = time.time() + 120
    while time.time() < end:
        j = json.loads(request(port, "GET", "/v1/fine_tuning/jobs/" + jid)[2])
        if j["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.02)
    stop.set()
    for t in threads:
        t.join()
    assert j["status"] == want, j
    assert not load or len(texts) > 1, "no completions during the job"
    print(json.dumps({"id": jid, "model": j["fine_tuned_model"], "error": j.get("error"),
                      "events": events(port, jid),
                      "completions": len(texts),
                      "unchanged": all(t == texts[0] for t in texts)}))


if __name__ == "__main__":
    main()
