"""The shared builders (tests/builders.py) write event files TensorBoard's own loader reads."""

from builders import event_files, write_plain_scalars


def test_builders_write_event_files(tmp_path):
    write_plain_scalars(str(tmp_path / "a"))
    assert len(event_files(str(tmp_path / "a"))) == 1
