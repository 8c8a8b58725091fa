//! iWARP
