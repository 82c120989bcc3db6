"""Prefix keys without a tokenizer: shared beginnings share keys, block by block."""

from __future__ import annotations

from llmbatch._calls.prefix import BLOCK_CHARS, GROUP_BLOCK, HotPrefixes, prefix_keys


def test_prompts_share_exactly_the_keys_of_the_blocks_they_share() -> None:
    system = "You are a careful assistant. " * 20  # several full blocks
    a = prefix_keys(system + "Question one?", None)
    b = prefix_keys(system + "Another question entirely?", None)
    shared = len(system) // BLOCK_CHARS
    assert a[:shared] == b[:shared]
    assert prefix_keys("short", None) == ()  # no full block: no affinity
    assert prefix_keys("x" * BLOCK_CHARS, None) != prefix_keys("y" * BLOCK_CHARS, None)


def test_a_conversation_is_keyed_by_its_roles_and_text_in_order() -> None:
    long = "context " * 40
    user = [{"role": "system", "content": long}, {"role": "user", "content": "hi"}]
    swapped = [{"role": "user", "content": long}, {"role": "user", "content": "hi"}]
    assert prefix_keys(None, user)
    assert prefix_keys(None, user) != prefix_keys(None, swapped)
    assert prefix_keys(None, None) == ()


def test_a_beginning_is_hot_from_its_second_sighting() -> None:
    hot = HotPrefixes()
    keys = prefix_keys("shared opening " * 40, None)
    assert len(keys) >= GROUP_BLOCK
    assert hot.group_of(keys) is None  # a one-off so far
    assert hot.group_of(keys) == keys[GROUP_BLOCK - 1]
    assert hot.group_of(keys[: GROUP_BLOCK - 1]) is None  # too short to group
