#!/usr/bin/env python3
"""Reads TensorBoard event files as TensorBoard does, written from the published format alone:
the record framing of TensorFlow's record files (uint64 length, masked CRC-32C of the length,
data, masked CRC-32C of the data, little-endian) and the Event, Summary, HistogramProto,
SummaryMetadata and TensorProto messages of TensorBoard's public .proto files, declared here
by their field numbers and decoded with the protobuf library (python3-protobuf). Nothing of
dhp's writer is used: its own CRC, its own message declarations.

    read_tfevents.py DIR      prints one JSON object: {"files": [...], "events": [...]}
                              exit 1 naming the file and offset of a damaged record
"""
import json
import os
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _messages():
    """TensorBoard's messages (tensorboard/compat/proto/*.proto), the fields read here."""
    f = descriptor_pb2.FileDescriptorProto(name="tfevents_reader.proto", package="reader", syntax="proto3")

    def message(parent, name, fields, oneof=None):
        m = parent.add()
        m.name = name
        if oneof:
            m.oneof_decl.add().name = oneof
        for fname, number, ftype, label, type_name, in_oneof in fields:
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                fd.type_name = type_name
            if in_oneof:
                fd.oneof_index = 0
        return m

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message(f.message_type, "Event", [
        ("wall_time", 1, F.TYPE_DOUBLE, opt, None, False),
        ("step", 2, F.TYPE_INT64, opt, None, False),
        ("file_version", 3, F.TYPE_STRING, opt, None, True),
        ("graph_def", 4, F.TYPE_BYTES, opt, None, True),
        ("summary", 5, F.TYPE_MESSAGE, opt, ".reader.Summary", True),
    ], oneof="what")
    summary = message(f.message_type, "Summary", [
        ("value", 1, F.TYPE_MESSAGE, rep, ".reader.Summary.Value", False)])
    message(summary.nested_type, "Value", [
        ("tag", 1, F.TYPE_STRING, opt, None, False),
        ("simple_value", 2, F.TYPE_FLOAT, opt, None, True),
        ("histo", 5, F.TYPE_MESSAGE, opt, ".reader.HistogramProto", True),
        ("tensor", 8, F.TYPE_MESSAGE, opt, ".reader.TensorProto", True),
        ("metadata", 9, F.TYPE_MESSAGE, opt, ".reader.SummaryMetadata", False),
    ], oneof="value")
    meta = message(f.message_type, "SummaryMetadata", [
        ("plugin_data", 1, F.TYPE_MESSAGE, opt, ".reader.SummaryMetadata.PluginData", False)])
    message(meta.nested_type, "PluginData", [("plugin_name", 1, F.TYPE_STRING, opt, None, False)])
    message(f.message_type, "HistogramProto", [
        ("min", 1, F.TYPE_DOUBLE, opt, None, False), ("max", 2, F.TYPE_DOUBLE, opt, None, False),
        ("num", 3, F.TYPE_DOUBLE, opt, None, False), ("sum", 4, F.TYPE_DOUBLE, opt, None, False),
        ("sum_squares", 5, F.TYPE_DOUBLE, opt, None, False),
        ("bucket_limit", 6, F.TYPE_DOUBLE, rep, None, False),
        ("bucket", 7, F.TYPE_DOUBLE, rep, None, False)])
    message(f.message_type, "TensorProto", [
        ("dtype", 1, F.TYPE_INT32, opt, None, False),
        ("string_val", 8, F.TYPE_BYTES, rep, None, False)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.MessageFactory(pool).GetPrototype(pool.FindMessageTypeByName("reader.Event"))


def records(path):
    with open(path, "rb") as fh:
        data = fh.read()
    at = 0
    while at < len(data):
        if at + 12 > len(data):
            raise ValueError(f"{path}: record at byte {at} is cut off in its header")
        head = data[at:at + 8]
        (n,) = struct.unpack("<Q", head)
        (crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if crc != masked(head):
            raise ValueError(f"{path}: the length's CRC of the record at byte {at} does not match")
        body = data[at + 12:at + 12 + n]
        tail = data[at + 12 + n:at + 16 + n]
        if len(body) != n or len(tail) != 4:
            raise ValueError(f"{path}: record at byte {at} is cut off")
        if struct.unpack("<I", tail)[0] != masked(body):
            raise ValueError(f"{path}: the data's CRC of the record at byte {at} does not match")
        yield body
        at += 16 + n


def main():
    folder = sys.argv[1]
    Event = _messages()
    files = sorted(n for n in os.listdir(folder) if "tfevents" in n and os.path.isfile(os.path.join(folder, n)))
    out = {"files": files, "events": []}
    try:
        for name in files:
            for body in records(os.path.join(folder, name)):
                e = Event()
                e.ParseFromString(body)
                ev = {"file": name, "step": e.step, "wall_time": e.wall_time}
                if e.WhichOneof("what") == "file_version":
                    ev["file_version"] = e.file_version
                for v in e.summary.value:
                    kind = v.WhichOneof("value")
                    if kind == "simple_value":
                        ev.setdefault("scalars", {})[v.tag] = v.simple_value
                    elif kind == "histo":
                        h = v.histo
                        ev.setdefault("histograms", {})[v.tag] = {
                            "min": h.min, "max": h.max, "num": h.num, "sum": h.sum,
                            "sum_squares": h.sum_squares, "bucket_limit": list(h.bucket_limit),
                            "bucket": list(h.bucket)}
                    elif kind == "tensor":
                        ev.setdefault("texts", {})[v.tag] = {
                            "plugin": v.metadata.plugin_data.plugin_name, "dtype": v.tensor.dtype,
                            "text": [s.decode("utf-8") for s in v.tensor.string_val]}
                out["events"].append(ev)
    except ValueError as err:
        print(f"read_tfevents: {err}", file=sys.stderr)
        sys.exit(1)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
