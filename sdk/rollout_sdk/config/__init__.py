"""SDK settings: the pydantic-settings classes and the process-wide instance (SDK.md §1.11).

They live in :mod:`rollout_sdk.config.settings`, upstream's module path for them; this
package exports the same names.
"""

from rollout_sdk.config.settings import *  # noqa: F403 - the package is its settings module
from rollout_sdk.config.settings import __all__ as __all__
