"""experiments/make_release_fixture.py without the release: --help, and one `error:` line (exit 2) for a path
that is not a checkout, before anything is written. The fixture it makes is tested in
tests/interop/test_release_defaults.py."""

import pytest

from t2mlr_jax.studies.fixtures import t2mlr_release as script


def test_help_and_a_path_that_is_no_checkout(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(flag in out for flag in ("--release_src", "--release_python", "--out"))
    with pytest.raises(SystemExit) as exit_info:
        script.main([f"--release_src={tmp_path}", f"--out={tmp_path / 'out'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("is not a checkout of princeton-pli/T2MLR (no src/t2mlr_wrapper/t2mlr_wrapper.py)")
    assert not (tmp_path / "out").exists()
