//! Generates the rdma-core structures from the installed headers, gives the shared object
//! rdma-core's symbol versions and soname, and names it as both libraries.

use std::path::{Path, PathBuf};

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=exports.map");
    bindgen::Builder::default()
        .header(dir.join("wrapper.h").to_string_lossy())
        .allowlist_type("ibv_.*|_ibv_.*|verbs_.*|_compat_ibv_.*|rdma_.*|ib_uverbs_advise_mr_.*")
        .allowlist_var("IBV_.*|RDMA_.*|IB_UVERBS_ADVISE_MR_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(true)
        .generate()
        .expect("bindgen reads <infiniband/verbs.h>: install libibverbs-dev and libclang-dev")
        .write_to_file(out.join("verbs.rs"))
        .expect("OUT_DIR is writable");
    let map = dir.join("exports.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", map.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    link_names(&out);
}

/// `libibverbs.so.1` and `librdmacm.so.1` in the profile's directory (target/<profile>/),
/// naming the library cargo builds in its `deps/` (for `cargo build` and for the tests'
/// builds alike), so that `LD_LIBRARY_PATH=target/<profile>` is all an application needs.
/// One object under both names: the dynamic loader maps a file once.
fn link_names(out: &Path) {
    const TARGET: &str = "deps/libibverbs.so";
    let Some(profile_dir) = out.ancestors().nth(3) else { return };
    for name in ["libibverbs.so.1", "librdmacm.so.1"] {
        let link = profile_dir.join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(Path::new(TARGET)) {
            let _ = std::fs::remove_file(&link);
            let _ = std::os::unix::fs::symlink(TARGET, &link);
        }
    }
}
