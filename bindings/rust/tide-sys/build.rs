// Links libtide.so: from $TIDE_LIB_DIR, else the source tree's build/capi. The directory
// goes to dependents as DEP_TIDE_LIB_DIR, for the rpath of their tests and examples.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=TIDE_LIB_DIR");
    let dir = match env::var("TIDE_LIB_DIR") {
        Ok(d) => PathBuf::from(d),
        Err(_) => PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../../build/capi"),
    };
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=tide");
    println!("cargo:lib_dir={}", dir.display());
}
