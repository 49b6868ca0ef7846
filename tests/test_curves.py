"""minknn/tools/curves.py and train.py --tensorboard: the event files minknn writes by hand, read back by
TensorBoard's own reader and protos (tensorboard is a test dependency; minknn never imports it).
The CRC against published vectors; an event against TensorBoard's Event, field by field; a run's
curves against the figures the run itself computed (each step's losses and lr, metrics.jsonl's
epochs); a run without the flag unchanged; a resumed run that draws every step once."""
import json
import os
import re
import struct

import pytest
import torch

import minknn.tools.trainer
import train
from helpers import DATA
from minknn.tools import curves
from minknn.tools.cli import run
from test_runs import stop_at
from test_training_step import factor  # the schedule, part 5's


def tensorboard():
    """TensorBoard's modules the tests read with: (event_accumulator, event_pb2, summary_pb2,
    event_file_loader, its masked_crc32c); one line where it is missing."""
    try:
        from tensorboard.backend.event_processing import event_accumulator, event_file_loader
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    except ImportError as e:
        pytest.fail(f"tests/test_curves.py reads the event files with TensorBoard, which is not "
                    f"installed ({e}): pip install -e '.[test]'", pytrace=False)
    return event_accumulator, event_pb2, summary_pb2, event_file_loader, masked_crc32c


def f32(x):
    """x as the float32 an event holds (Summary.Value.simple_value), read back as TensorBoard does."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


# ------------------------------------------------------------------------ the format

# CRC-32C check values: the catalogue's "123456789", RFC 3720 (iSCSI) appendix B.4's 32-byte ones
CRC32C = [(b"", 0), (b"123456789", 0xE3069283), (bytes(32), 0x8A9136AA), (b"\xff" * 32, 0x62A8AB43),
          (bytes(range(32)), 0x46DD794E), (bytes(range(31, -1, -1)), 0x113FDB5C)]


def test_crc32c_against_known_vectors():
    for data, want in CRC32C:
        got = curves.crc32c(data)
        assert got == want, (f"crc32c({data[:12]!r}{'...' if len(data) > 12 else ''}) = {got:#010x}, not "
                             f"{want:#010x} (CRC-32C: reflected polynomial 0x82F63B78, start and end inverted)")
    masked_crc32c = tensorboard()[4]
    for data in [b"", b"123456789", struct.pack("<Q", 61), bytes(range(256)) * 3]:
        assert curves.masked_crc(data) == masked_crc32c(data), (
            f"masked_crc({data[:12]!r}) = {curves.masked_crc(data):#010x}; TensorBoard's masked_crc32c gives "
            f"{masked_crc32c(data):#010x} (the mask: ((crc >> 15 | crc << 17) + 0xa282ead8) mod 2^32)")


def test_an_event_is_tensorboards_event_field_by_field():
    """curves.event's bytes decoded by TensorBoard's own Event (tensorboard/compat/proto/event.proto), then
    byte for byte against its serialisation: a wrong field number or wire type names the field."""
    _, event_pb2, summary_pb2, _, _ = tensorboard()
    cases = {"scalars": (dict(scalars={"step/sst/loss": 1.25, "dev/overall": 0.5}),
                         dict(summary=summary_pb2.Summary(value=[
                             summary_pb2.Summary.Value(tag="step/sst/loss", simple_value=1.25),
                             summary_pb2.Summary.Value(tag="dev/overall", simple_value=0.5)]))),
             "file version": (dict(file_version="brain.Event:2"), dict(file_version="brain.Event:2")),
             "START": (dict(start=True), dict(session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))}
    for case, (ours, theirs) in cases.items():
        data = curves.event(1234.5, 300, **ours)
        got = event_pb2.Event.FromString(data)
        want = event_pb2.Event(wall_time=1234.5, step=300, **theirs)
        fields = {"wall_time (1, double)": (got.wall_time, want.wall_time), "step (2, int64)": (got.step, want.step),
                  "file_version (3, string)": (got.file_version, want.file_version),
                  "summary (5): [(tag 1, simple_value 2)]": ([(v.tag, v.simple_value) for v in got.summary.value],
                                                             [(v.tag, v.simple_value) for v in want.summary.value]),
                  "session_log (7): status (1)": (got.session_log.status, want.session_log.status),
                  "bytes of fields the Event does not have": (len(data) - len(known(got).SerializeToString()), 0)}
        wrong = [f"{name}: {g!r}, not {w!r}" for name, (g, w) in fields.items() if g != w]
        assert not wrong, f"{case}: curves.event read by TensorBoard's Event: " + "; ".join(wrong)
        assert data == want.SerializeToString(), (f"{case}: curves.event's bytes {data.hex()}; protobuf's for the "
                                                 f"same Event {want.SerializeToString().hex()}")


def known(event):
    """A copy of a decoded Event without the fields its .proto does not declare (protobuf keeps them aside)."""
    copy = type(event)()
    copy.CopyFrom(event)
    copy.DiscardUnknownFields()
    return copy


def records_of(path):
    """The data of each record of an event file, its two CRCs checked against TensorBoard's masked_crc32c."""
    masked_crc32c = tensorboard()[4]
    raw, at, found = open(path, "rb").read(), 0, []
    while at < len(raw):
        length = raw[at:at + 8]
        (n,), (length_crc,) = struct.unpack("<Q", length), struct.unpack("<I", raw[at + 8:at + 12])
        data, (data_crc,) = raw[at + 12:at + 12 + n], struct.unpack("<I", raw[at + 12 + n:at + 16 + n])
        where = f"{os.path.basename(path)}, record {len(found) + 1}"
        assert length_crc == masked_crc32c(length), \
            f"{where}: the length's CRC is {length_crc:#010x}, TensorBoard's masked_crc32c " \
            f"{masked_crc32c(length):#010x}"
        assert data_crc == masked_crc32c(data), \
            f"{where}: the data's CRC is {data_crc:#010x}, TensorBoard's masked_crc32c {masked_crc32c(data):#010x}"
        found.append(data)
        at += 16 + n
    return found


# ------------------------------------------------------------------------ a run's curves

def event_files(run):
    folder = os.path.join(run, "tensorboard")
    return sorted(os.path.join(folder, f) for f in os.listdir(folder))


def curves_of(run):
    """{tag: [(step, value)]} as TensorBoard's EventAccumulator reads the run's tensorboard/ folder (every file,
    in name order; none left out by its sampling)."""
    event_accumulator = tensorboard()[0]
    files = event_files(run)
    assert files and all(re.fullmatch(r"events\.out\.tfevents\.\d{10}\.[^/]+", os.path.basename(f)) for f in files), \
        f"{run}/tensorboard: {[os.path.basename(f) for f in files]}, not events.out.tfevents.<time>.<host> files"
    for f in files:
        records_of(f)  # each CRC checked, with a message that says which
    acc = event_accumulator.EventAccumulator(os.path.join(run, "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def records_in(run):
    return [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]


def figures(record, prefix=""):
    """A metrics.jsonl line's numbers by their path in it ("dev/sst/acc"), written out here on their own."""
    out = {}
    for name, value in record.items():
        if isinstance(value, dict):
            out.update(figures(value, f"{prefix}{name}/"))
        elif name != "epoch":
            out[prefix + name] = value
    return out


def recording(monkeypatch):
    """train.train_step, recorded: each step's (lr it took, task -> loss, task -> term -> value, conflicts)."""
    seen, real = [], train.train_step

    def step(trainer, batches):
        lr = trainer.optimizer.param_groups[0]["lr"]
        losses, terms, conflicts = real(trainer, batches)
        seen.append((lr, {n: v.item() for n, v in losses.items()},
                     {n: {t: v.item() for t, v in ts.items()} for n, ts in terms.items()}, conflicts))
        return losses, terms, conflicts
    monkeypatch.setattr(train, "train_step", step)
    return seen


def run_train(tiny_bert_dir, data_dir, out, *extra):
    return train.main(["--model", tiny_bert_dir, "--data_dir", data_dir, "--out", str(out), "--batch_size", "8",
                       "--max_len", "32", "--device", "cpu", "--steps_per_epoch", "3", *extra])


def test_a_runs_curves_are_its_own_figures(tiny_bert_dir, data_dir, tmp_path, monkeypatch):
    """Two tasks, a loss of two terms and PCGrad, 2 epochs of 3 steps: each step's loss, terms, lr and conflicts
    at steps 1..6 are the ones the step computed (float32, as an event holds them), the lr the schedule's, and each
    epoch's figures are its metrics.jsonl line's, at the epoch's last step."""
    seen = recording(monkeypatch)
    run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--task", "multitask", "--tasks", "sst,sts",
              "--loss", "proxyanchor", "--pcgrad", "--epochs", "2", "--warmup", "0.5", "--lr", "1e-3",
              "--tensorboard")
    drawn, records = curves_of(tmp_path / "run"), records_in(tmp_path / "run")
    steps = range(1, 7)
    want = {"step/lr": [lr for lr, _, _, _ in seen],
            "step/sst/loss": [losses["sst"] for _, losses, _, _ in seen],
            "step/sst/ce": [terms["sst"]["ce"] for _, _, terms, _ in seen],
            "step/sst/metric": [terms["sst"]["metric"] for _, _, terms, _ in seen],
            "step/sts/loss": [losses["sts"] for _, losses, _, _ in seen],
            "step/conflicting_pairs": [conflicts for _, _, _, conflicts in seen]}  # one pair of tasks
    assert len(seen) == 6, f"the run took {len(seen)} steps, not 6"
    for tag, values in want.items():
        assert drawn.get(tag) == [(s, f32(v)) for s, v in zip(steps, values)], \
            f"{tag}: TensorBoard reads {drawn.get(tag)}; the run's steps computed {list(zip(steps, values))}"
    torch.testing.assert_close(want["step/lr"], [1e-3 * factor(s, 6, 0.5) for s in range(6)], rtol=1e-12, atol=0,
                               msg=lambda m: f"step/lr is not the schedule's lr at each step: {m}")
    for r in records:
        for tag, value in figures(r).items():
            assert drawn.get(tag, [])[r["epoch"] - 1:r["epoch"]] == [(3 * r["epoch"], f32(value))], \
                f"{tag}: TensorBoard reads {drawn.get(tag)}; metrics.jsonl's epoch {r['epoch']} says {value}"
    epoch_tags = set(figures(records[0]))
    assert {"dev/overall", "dev/sst/acc", "dev/sts/pearson", "train_loss/sst", "conflicting_pairs"} <= epoch_tags
    assert set(drawn) == set(want) | epoch_tags, \
        f"tags drawn that the run does not record: {set(drawn) - set(want) - epoch_tags}"
    assert len(event_files(tmp_path / "run")) == 1, "one process of one run: one event file"


def run_folder_files(run):
    return sorted(os.path.relpath(os.path.join(d, f), run) for d, _, fs in os.walk(run) for f in fs)


def test_without_the_flag_nothing_changes(tiny_bert_dir, data_dir, tmp_path, capsys):
    """The same run with and without --tensorboard: the same records and lines (but the one that names the
    curves), and without it no tensorboard/ folder, nothing printed of it."""
    said = {}
    for name, flags in (("plain", []), ("curves", ["--tensorboard"])):
        run_train(tiny_bert_dir, data_dir, tmp_path / name, "--epochs", "2", "--lr", "1e-3", *flags)
        text = capsys.readouterr().out.replace(str(tmp_path / name), "RUN")
        said[name] = re.sub(r"\d+ s\b", "N s", text).splitlines()  # the seconds an epoch took
    plain, drawn = tmp_path / "plain", tmp_path / "curves"
    assert run_folder_files(plain) == [f for f in run_folder_files(drawn) if not f.startswith("tensorboard")], \
        f"without --tensorboard: {run_folder_files(plain)}; with it: {run_folder_files(drawn)}"
    assert not os.path.exists(plain / "tensorboard") and os.path.isdir(drawn / "tensorboard")
    strip = [{k: v for k, v in r.items() if k != "epoch_seconds"} for r in records_in(plain)]
    assert strip == [{k: v for k, v in r.items() if k != "epoch_seconds"} for r in records_in(drawn)], \
        "--tensorboard changed the run's records"
    assert not [line for line in said["plain"] if "tensorboard" in line.lower() or "curves" in line], said["plain"]
    named = [line for line in said["curves"] if line.startswith("curves: ")]
    assert len(named) == 1 and "tensorboard --logdir RUN" in named[0], said["curves"]
    assert said["plain"] == [line for line in said["curves"] if line not in named], \
        f"the lines without --tensorboard:\n{said['plain']}\nwith it:\n{said['curves']}"


def refused(argv):
    """train.py's one line and exit status, through minknn.tools.cli.run as `python train.py` runs it."""
    with pytest.raises(SystemExit) as exit_:
        run(lambda: train.main(argv))
    return exit_.value.code


def test_a_curves_folder_that_cannot_be_written_is_one_line_before_anything_is_read(tiny_bert_dir, data_dir,
                                                                                  tmp_path, monkeypatch, capsys):
    """--tensorboard where the run folder's tensorboard/ is a file, or a folder that refuses files (read-only: made
    so by mkstemp failing there, as root writes anywhere): one line naming it, exit status 2, before the model and
    data are read (build never called), the run folder left as it was; a new run's folder made for it goes."""
    monkeypatch.setattr(train, "build", lambda *a, **k: pytest.fail("the run was built before the curves' check"))
    argv = ["--model", tiny_bert_dir, "--data_dir", data_dir, "--device", "cpu", "--tensorboard", "--out"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tensorboard").write_text("mine")
    assert refused(argv + [str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --tensorboard: {tmp_path / 'run' / 'tensorboard'} is a file, where the run's curves go; "
                   f"move it, or leave out --tensorboard"], err
    assert os.listdir(tmp_path / "run") == ["tensorboard"]
    mkstemp = curves.tempfile.mkstemp

    def read_only(*args, dir=None, **kwargs):
        if dir == str(tmp_path / "new" / "tensorboard"):
            raise PermissionError(13, os.strerror(13))
        return mkstemp(*args, dir=dir, **kwargs)
    monkeypatch.setattr(curves.tempfile, "mkstemp", read_only)
    assert refused(argv + [str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --tensorboard: {tmp_path / 'new' / 'tensorboard'} cannot be written "
                   f"({os.strerror(13)})"], err
    assert sorted(os.listdir(tmp_path)) == ["run"], "the new run's folder was left behind"


def test_curves_that_cannot_be_written_mid_run_stop_it_in_one_line_and_it_resumes(tiny_bert_dir, data_dir,
                                                                                tmp_path, monkeypatch, capsys):
    """The disk gone read-only after the start's check, so epoch 1's events cannot be written: one line naming the
    curves and how to go on, exit status 2, after the epoch's checkpoint.pt, last.pt and metrics.jsonl are saved
    (checkpoint.pt never ahead of last.pt); --resume goes on from epoch 2 and finishes."""
    def read_only(folder):
        raise OSError(30, os.strerror(30), folder)
    with monkeypatch.context() as m:
        m.setattr(curves, "new_file", read_only)
        assert refused(["--model", tiny_bert_dir, "--data_dir", data_dir, "--out", str(tmp_path / "run"),
                        "--batch_size", "8", "--max_len", "32", "--device", "cpu", "--steps_per_epoch", "3",
                        "--epochs", "2", "--tensorboard"]) == 2
    err = capsys.readouterr().err  # the progress bars', then the error's line, last
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: "), err[-2000:]
    err = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and err[0].startswith(f"error: --tensorboard: {tmp_path / 'run' / 'tensorboard'} cannot be "
                                               f"written ({os.strerror(30)})"), err
    assert err[0].endswith(f"continue with python train.py --resume {tmp_path / 'run'}"), err
    last = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert last["epoch"] == 1 and torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert [r["epoch"] for r in records_in(tmp_path / "run")] == [1]
    train.main(["--resume", str(tmp_path / "run")])
    assert [r["epoch"] for r in records_in(tmp_path / "run")] == [1, 2]
    assert json.loads((tmp_path / "run" / "summary.json").read_text()).get("stopped") is None


@pytest.fixture(scope="module")
def alone(tiny_bert_dir, tmp_path_factory):
    """A --tensorboard run of 3 epochs of 3 steps, left alone."""
    run = tmp_path_factory.mktemp("alone") / "run"
    run_train(tiny_bert_dir, DATA, run, "--epochs", "3", "--lr", "1e-3", "--tensorboard")
    return run


def stop_between_the_events_and_last_pt(monkeypatch):
    """As a kill -9 just after epoch 2's events were written, before its last.pt: the resumed run trains epoch 2
    again, and its events are in the first file already."""
    real = minknn.tools.trainer.save_last

    def save_last(out, **state):
        if state["epoch"] == 2:
            raise KeyboardInterrupt
        real(out, **state)
    monkeypatch.setattr(minknn.tools.trainer, "save_last", save_last)


@pytest.mark.parametrize("stop", ["ctrl-c in epoch 2", "killed between epoch 2's events and its last.pt"])
def test_a_resumed_run_draws_each_step_once(alone, tiny_bert_dir, data_dir, tmp_path, monkeypatch, stop):
    """Stopped in epoch 2, then --resume: a second file that starts (after its version) with SessionLog START at
    step 4, the first step after epoch 1, so that TensorBoard reads the curves of the run left alone, each step
    once, though the killed run's file holds epoch 2 too."""
    _, event_pb2, _, event_file_loader, _ = tensorboard()
    with monkeypatch.context() as m:
        stop_at(m, 4, KeyboardInterrupt) if stop.startswith("ctrl-c") else stop_between_the_events_and_last_pt(m)
        with pytest.raises(SystemExit):
            run_train(tiny_bert_dir, data_dir, tmp_path / "run", "--epochs", "3", "--lr", "1e-3", "--tensorboard")
    train.main(["--resume", str(tmp_path / "run")])
    first, second = files = event_files(tmp_path / "run")
    steps = [{e.step for e in event_file_loader.EventFileLoader(f).Load() if e.summary.value} for f in files]
    assert steps[0] == ({1, 2, 3} if stop.startswith("ctrl-c") else {1, 2, 3, 4, 5, 6}), \
        f"{stop}: the stopped run's file holds the steps {sorted(steps[0])}"
    head = [event_pb2.Event.FromString(data) for data in records_of(second)[:2]]
    assert head[0].file_version == "brain.Event:2" and head[1].session_log.status == event_pb2.SessionLog.START \
        and head[1].step == 4, f"the resumed run's file starts with {head}, not its version then START at step 4"
    drawn, left_alone = curves_of(tmp_path / "run"), curves_of(alone)
    assert set(drawn) == set(left_alone), f"tags: {sorted(drawn)}; the run left alone's: {sorted(left_alone)}"
    for tag in drawn:
        got, want = drawn[tag], left_alone[tag]
        if tag == "epoch_seconds":  # the clock's, not the run's
            got, want = [s for s, _ in got], [s for s, _ in want]
        assert got == want, f"{stop}, then --resume: {tag} reads {got}; the run left alone's {want}"
