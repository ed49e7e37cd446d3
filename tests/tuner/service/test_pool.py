"""The worker pool's share of the host for each worker (`tuner.service.pool`)."""

from __future__ import annotations

from tuner.service.pool import COMPILE_THREADS_VARIABLE, compile_threads_env


def test_workers_sharing_a_host_split_its_cores_for_inductors_compile_workers() -> None:
    # Four workers on 64 cores: 16 each, not Inductor's 32 each (128 on 64 cores).
    assert compile_threads_env(4, cpus=64, environ={}) == {COMPILE_THREADS_VARIABLE: "16"}
    # Inductor's own cap holds on a large host, and a small one still gives each worker one.
    assert compile_threads_env(2, cpus=192, environ={}) == {COMPILE_THREADS_VARIABLE: "32"}
    assert compile_threads_env(8, cpus=4, environ={}) == {COMPILE_THREADS_VARIABLE: "1"}


def test_one_worker_or_the_users_own_setting_is_left_alone() -> None:
    assert compile_threads_env(1, cpus=64, environ={}) == {}
    assert compile_threads_env(4, cpus=64, environ={COMPILE_THREADS_VARIABLE: "8"}) == {}
