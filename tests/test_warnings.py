"""pytest's warning filters (pyproject.toml): third-party deprecations are filtered, ours still show."""

import warnings

import pytest


def _shown(module: str, category: type[Warning]) -> bool:
    """Whether a warning attributed to `module` passes the filters pytest installed for this test."""
    with warnings.catch_warnings(record=True) as caught:  # keeps the filters, records what passes them
        warnings.warn_explicit(f"probe from {module}", category, filename=f"{module}.py", lineno=1, module=module,
                               registry={})
    return bool(caught)


@pytest.mark.parametrize("module", ["triton.runtime.interpreter", "numpy", "jupyter_client.session", "pandas"])
@pytest.mark.parametrize("category", [DeprecationWarning, PendingDeprecationWarning])
def test_third_party_deprecations_are_filtered(module, category):
    assert not _shown(module, category)


@pytest.mark.parametrize("module", ["harness.runner", "scenarios.ssm_options", "states", "results.plots",
                                    "kernels.ssm.native", "test_warnings"])
def test_our_deprecations_show(module):
    assert _shown(module, DeprecationWarning)


@pytest.mark.parametrize("module", ["triton.runtime.interpreter", "harness.runner"])
@pytest.mark.parametrize("category", [UserWarning, RuntimeWarning, FutureWarning])
def test_other_categories_show_from_anywhere(module, category):
    assert _shown(module, category)
