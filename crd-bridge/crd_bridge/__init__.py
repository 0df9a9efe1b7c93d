"""The CRD bridge: everything that touches ksquad.io objects (watch Runs, start, cancel and signal their
workflows, resolve references, write Run status and Events)."""
