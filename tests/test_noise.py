"""The counter-based generator: Random123 known answers, keying, and independence from batch layout."""

import torch

from portable_spec.core.noise import STREAM_SAMPLE, VerifyNoise, keyed_uniforms, philox4x32

M = 0xFFFFFFFF
KNOWN_ANSWERS = [  # Random123 kat_vectors, philox4x32_10: counter, key -> output
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M, M, M, M), (M, M), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def test_philox_matches_random123_known_answers():
    for counter, key, expected in KNOWN_ANSWERS:
        assert tuple(philox4x32(torch.tensor(counter), torch.tensor(key)).tolist()) == expected


def test_uniforms_depend_only_on_their_key():
    positions = torch.tensor([[5, 6, 7], [100, 101, 102]])
    batch = keyed_uniforms(7, torch.tensor([3, 9]), positions, STREAM_SAMPLE, 10)
    alone = keyed_uniforms(7, torch.tensor([9]), positions[1:], STREAM_SAMPLE, 10)
    assert torch.equal(batch[1], alone[0])  # batch composition and order do not matter
    assert not torch.equal(batch, keyed_uniforms(8, torch.tensor([3, 9]), positions, STREAM_SAMPLE, 10))
    assert not torch.equal(batch, keyed_uniforms(7, torch.tensor([3, 9]), positions, 0, 10))


def test_uniforms_are_in_open_interval_and_roughly_uniform():
    u = keyed_uniforms(1, torch.arange(64), torch.arange(64)[:, None].repeat(1, 4), STREAM_SAMPLE, 1000)
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.005
    histogram = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert float((histogram - 0.1).abs().max()) < 0.005


def test_verify_noise_positions():
    noise = VerifyNoise.for_chain(3, torch.tensor([0, 1]), torch.tensor([10, 20]), num_drafts=2, vocab_size=5)
    assert noise.accept_uniform.shape == (2, 2) and noise.sample_uniform.shape == (2, 3, 5)
    shifted = VerifyNoise.for_chain(3, torch.tensor([0, 1]), torch.tensor([11, 21]), num_drafts=2, vocab_size=5)
    assert torch.equal(noise.sample_uniform[:, 1:], shifted.sample_uniform[:, :2])  # keyed by absolute position


def test_extreme_bits_stay_inside_the_open_interval():
    """All-ones bits must give u < 1, else -log(u) = -0 and the exponential race divides by zero."""
    from portable_spec.core.noise import bits_to_uniform

    u = bits_to_uniform(torch.tensor([0, 0xFFFFFFFF]))
    assert 0 < float(u[0]) and float(u[1]) < 1.0 and bool((-torch.log(u) > 0).all())
