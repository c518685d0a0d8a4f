"""Make this checkout importable as the collection `ansible_collections.gpufleet.inference`.

The tree is linked at .build/collections/ansible_collections/gpufleet/inference (the same link
`make` uses for ANSIBLE_COLLECTIONS_PATH), so tests import the code exactly as Ansible does.
"""
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLLECTIONS = REPO / ".build" / "collections"
LINK = COLLECTIONS / "ansible_collections" / "gpufleet" / "inference"

if not LINK.exists():
    LINK.parent.mkdir(parents=True, exist_ok=True)
    try:
        LINK.symlink_to(REPO, target_is_directory=True)
    except FileExistsError:
        pass
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", str(COLLECTIONS))
