//! CM
