"""Transports say what they can do (``Transport.capabilities``, ``process_key``,
``check_threads``), and nothing above ``allreducers/transports/`` tests a transport's type or
reaches into its attributes."""

import re
from pathlib import Path

from allreducers.transports import TaggedTransport, local_group
from allreducers.transports.base import Capabilities
from allreducers.transports.recording import RecordingTransport

ROOT = Path(__file__).resolve().parent.parent
ABOVE = ("compressors", "syncbench", "trainer", "trainreport")
#: What guessing a transport's kind looks like.
GUESSES = re.compile(
    r"isinstance\([^)]*(Local|MPI|TorchDistributed|Tagged)Transport|"
    r"getattr\((transport|base|self\.transport), \"(comm|group|checks_agreement)\"|"
    r"__name__ == \"\w*Transport\""
)


def test_no_layer_above_the_transports_guesses_their_kind():
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ABOVE
        for path in sorted((ROOT / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if GUESSES.search(line)
    ]
    assert found == []


def test_views_and_recordings_answer_for_their_transport():
    def body(transport):
        view = TaggedTransport(transport, space=2)
        recording = RecordingTransport(transport)
        return (
            transport.capabilities,
            view.capabilities,
            transport.process_key(),
            view.process_key(),
            recording.capabilities.checks_agreement,
        )

    first, second = local_group(2, rendezvous=True).run(body)
    assert (
        first[0]
        == first[1]
        == Capabilities(device_memory=True, posted_receives=True, rendezvous=True)
    )
    assert first[2] == first[3] != second[2]  # one communication thread per in-process rank
    assert first[4] is False
