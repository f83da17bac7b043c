// The example finds libtide.so where tide-sys linked it.
fn main() {
    if let Ok(dir) = std::env::var("DEP_TIDE_LIB_DIR") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{dir}");
    }
}
