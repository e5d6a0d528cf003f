from quantlab.records.fingerprint import describe, fingerprint_id, machine_fingerprint


def test_the_fingerprint_names_machine_hardware_and_software() -> None:
    fp = machine_fingerprint()
    assert {"host", "machine_id", "cpu_model", "cpu_threads", "gpus", "torch", "transformers", "quantlab"} <= set(fp)
    assert fp["machine_id"] and fp["cpu_threads"] >= 1
    assert fp["host"] in describe(fp)


def test_any_difference_changes_the_fingerprint_id() -> None:
    fp = machine_fingerprint()
    same = fingerprint_id(dict(fp))
    assert same == fingerprint_id(fp) and len(same) == 16
    for field, other in (("host", "another-host"), ("machine_id", "0" * 32), ("cpu_threads", 64), ("torch", "9.9"),
                         ("gpus", [{"name": "NVIDIA H200", "uuid": "GPU-1"}])):
        assert fingerprint_id({**fp, field: other}) != same, field
