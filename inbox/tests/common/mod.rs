//! What the inbox crate's tests share.

/// An example of this crate, built by `cargo test` beside the tests
/// (`target/<profile>/examples/<name>`). `cargo test --test …` alone does not build
/// examples: run `cargo test -p outbox-relay-inbox` (or `--workspace`).
pub fn example(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target dir");
    let path = dir.join("examples").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo test -p outbox-relay-inbox` (it builds the examples)",
        path.display()
    );
    path
}
