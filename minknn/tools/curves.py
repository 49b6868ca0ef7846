"""A run's curves as TensorBoard event files (train.py --tensorboard), written by hand: minknn
imports neither tensorboard nor protobuf, and a run writes the files without them installed.

    curves = Curves("runs/sst/tensorboard")   # resumed_at=S: a resumed run's first step
    curves.step(step, lr, losses, terms)      # each training step's figures, kept in memory
    curves.epoch(step, record)                # an epoch's record, metrics.jsonl's line
    curves.write()                            # appended to the file, once an epoch
    tensorboard --logdir runs/                # (TensorBoard installed) draws them

The tags: step/lr, step/<task>/loss, step/<task>/<term> (the loss's terms: ce or bce and
metric, unweighted, as the progress bar shows them), step/conflicting_pairs (--pcgrad: the share
of the step's task pairs that conflicted), all at the step's number, counted from 1 over the run;
then each figure of an epoch's metrics.jsonl line under its path there (dev/sst/acc, dev/overall,
train_loss/sst, epoch_seconds, conflicting_pairs), at the number of the epoch's last step.

The format, read from TensorFlow's sources as TensorBoard ships them (tensorboard/summary/writer/
record_writer.py and compat/tensorflow_stub/pywrap_tensorflow.py):
  a file events.out.tfevents.<seconds, 10 digits>.<host name> is a sequence of records, each
      uint64 length | uint32 masked_crc(length) | data | uint32 masked_crc(data)   (little-endian)
  crc: CRC-32C (Castagnoli, reversed polynomial 0x82F63B78), start and end inverted, and masked
      masked_crc = ((crc >> 15 | crc << 17) + 0xa282ead8) mod 2^32
  data: an Event, protobuf (tensorboard/compat/proto/event.proto and summary.proto in
  TensorBoard's repository; its package ships them compiled, event_pb2.py and summary_pb2.py,
  whose descriptors give these numbers, and tests/test_curves.py decodes with them):
      Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
                Summary summary = 5; SessionLog session_log = 7 }
      Summary { repeated Value value = 1 }  Value { string tag = 1; float simple_value = 2 }
      SessionLog { SessionStatus status = 1 }  (START = 1)
  The first record says file_version "brain.Event:2". Protobuf writes a field as its key,
  varint(number << 3 | wire type), then its value: a varint (wire type 0), 8 bytes (1), a
  varint length and that many bytes (2: strings, messages), or 4 bytes (5).
A value is a float32 there: TensorBoard shows 7 digits; metrics.jsonl keeps the record.

When. Events are kept in memory and written with each epoch's files (trainer.save, before
last.pt), so a killed run's file holds whole epochs (a kill mid-write cuts its last record short,
which TensorBoard's reader skips) and a step costs no file access; an epoch that does not finish
(Ctrl-C, divergence) writes nothing of its own, as it saves nothing. A resumed run writes a new
file, starting with SessionLog START at its first step: TensorBoard then drops what earlier files
hold from that step on (an epoch a kill -9 caught between its events and its last.pt, which the
resumed run trains again), so every step is drawn once. A folder that cannot be written is found
when the run opens its folder (check_folder, from run.open_folder); a write that fails later is
one line, said once the epoch's last.pt is saved (trainer.save), so the run resumes.
"""
import os
import socket
import struct
import tempfile
import time

from minknn import MinknnError


def crc32c_table():
    """The 256 CRCs of one byte, reflected, for the Castagnoli polynomial."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


TABLE = crc32c_table()


def crc32c(data):
    """CRC-32C of bytes, a byte at a time (crc32c(b"123456789") == 0xE3069283)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data):
    """TensorFlow's mask: a CRC of data that itself holds CRCs stays a good check."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data):
    """One record of an event file: the length, its CRC, the data, its CRC."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc(length)) + data
            + struct.pack("<I", masked_crc(data)))


def varint(n):
    """A non-negative integer, 7 bits a byte, the lowest first; the high bit says more follow."""
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def key(number, wire_type):
    return varint(number << 3 | wire_type)


def nested(number, payload):
    """A length-delimited field (wire type 2): a string's bytes or a message's."""
    return key(number, 2) + varint(len(payload)) + payload


def event(wall_time, step, scalars=None, file_version=None, start=False):
    """An Event's bytes: its time and step, and a Summary of the scalars (tag -> value), the file's
    version or a SessionLog START."""
    out = key(1, 1) + struct.pack("<d", wall_time) + key(2, 0) + varint(step)
    if file_version:
        out += nested(3, file_version.encode())
    if scalars:
        out += nested(5, b"".join(nested(1, nested(1, tag.encode()) + key(2, 5)
                                         + struct.pack("<f", value))
                                  for tag, value in scalars.items()))
    if start:
        out += nested(7, key(1, 0) + varint(1))
    return out


def flat(record, prefix=""):
    """A metrics.jsonl line's figures, tag -> value, each under its path ("dev/sst/acc")."""
    out = {}
    for name, value in record.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{name}/"))
        elif name != "epoch" and isinstance(value, (int, float)):
            out[prefix + name] = value
    return out


class Curves:
    """The events of one run's process, to one file of `folder`, made at the first write."""

    def __init__(self, folder, resumed_at=None):
        self.folder, self.path = folder, None
        # (wall time, step, scalars, start): a resumed run's first event is its START
        self.pending = [] if resumed_at is None else [(time.time(), resumed_at, None, True)]

    def step(self, step, lr, losses, terms, conflicts=None):
        """A training step's figures, floats already: the lr it took, each task's loss and its
        terms (task -> term -> value), and with --pcgrad how many task pairs conflicted."""
        scalars = {"step/lr": lr}
        for name, loss in losses.items():
            scalars[f"step/{name}/loss"] = loss
            scalars.update({f"step/{name}/{term}": v for term, v in terms[name].items()})
        if conflicts is not None:
            scalars["step/conflicting_pairs"] = conflicts / (len(losses) * (len(losses) - 1) // 2)
        self.pending.append((time.time(), step, scalars, False))

    def epoch(self, step, record):
        """An epoch's record (metrics.jsonl's line), at its last step."""
        self.pending.append((time.time(), step, flat(record), False))

    def write(self):
        """The events so far appended to the file, then flushed: what a killed run keeps. A
        failed write is one line (MinknnError), the events kept in memory."""
        if not self.pending:
            return
        data = b"".join(record(event(t, step, scalars, start=start))
                        for t, step, scalars, start in self.pending)
        try:
            if self.path is None:  # a new file; TensorBoard reads a folder's files in name order
                data = record(event(self.pending[0][0], 0, file_version="brain.Event:2")) + data
                self.path = new_file(self.folder)
            with open(self.path, "ab") as f:
                f.write(data)
        except OSError as e:  # a disk gone read-only or full, the folder removed mid-run
            raise MinknnError(f"--tensorboard: {self.path or self.folder} cannot be written "
                              f"({e.strerror})") from None
        self.pending = []


def check_folder(folder):
    """Before a run with --tensorboard reads anything (run.open_folder): its curves' folder made,
    and a file made and removed there; one line if not. Returns the folders it made, [folder] or
    [] (for the run to remove if it stops before its first step)."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise MinknnError(f"--tensorboard: {folder} is a file, where the run's curves go; move it, "
                          f"or leave out --tensorboard")
    made = [] if os.path.exists(folder) else [folder]
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, suffix=".tmp")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        if made and os.path.isdir(folder):
            os.rmdir(folder)
        raise MinknnError(f"--tensorboard: {folder} cannot be written ({e.strerror})") from None
    return made


def new_file(folder):
    """A new event file's path, its file created: another run's in the same second (a resumed
    run, in the tests) gets .2, .3, ... after the host name, which sorts after it."""
    os.makedirs(folder, exist_ok=True)
    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
    path, n = os.path.join(folder, name), 1
    while True:
        try:
            open(path, "xb").close()
            return path
        except FileExistsError:
            n += 1
            path = os.path.join(folder, f"{name}.{n}")
