"""Device profiles as data (``profiles/*.toml``) and host detection, both ending in a ``Target``."""

from .detect import host_profile, profile_from_host, resolve_profile, resolve_target
from .profile import DeviceProfile, ProfileError, list_profiles, load_profile, load_profile_file, parse_profile

__all__ = [
    "DeviceProfile", "ProfileError", "host_profile", "list_profiles", "load_profile", "load_profile_file",
    "parse_profile", "profile_from_host", "resolve_profile", "resolve_target",
]
