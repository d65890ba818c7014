//! The `[messages]` section's checks that span sections (`[outbox]`, `[dead_letter]`) and
//! what the validated configuration asks of PostgreSQL. They live with the configuration,
//! which composes the sections; the relay knows nothing of the file.

use crate::lsn::Lsn;

fn validate(text: &str) -> Result<super::Validated, String> {
    let config: super::Config = toml::from_str(text).map_err(|e| e.to_string())?;
    config.validate(None).map_err(|p| p.join("\n"))
}

#[test]
fn a_messages_only_configuration_and_its_cross_section_checks() {
    let base = "[postgres]\nurl = \"postgres://u@h/d\"\n";
    let v = validate(&format!(
        "{base}[outbox]\nenabled = false\n[messages]\nprefixes = [\"orders\"]\n"
    ))
    .unwrap();
    assert!(!v.outbox_enabled());
    let spec = v.source();
    assert!(!spec.outbox() && spec.messages);
    assert!(
        crate::pg::slot::start_replication_command(&spec, Lsn(0)).ends_with(", messages 'true')")
    );
    let err = validate(&format!("{base}[outbox]\nenabled = false\n")).unwrap_err();
    assert!(
        err.contains("outbox.enabled") && err.contains("[messages]"),
        "{err}"
    );
    let err = validate(&format!(
        "{base}[outbox]\nenabled = false\n[messages]\nenabled = false\nprefixes = [\"o\"]\n"
    ))
    .unwrap_err();
    assert!(err.contains("outbox.enabled"), "{err}");
    let err = validate(&format!(
        "{base}[messages]\ntopics = [\"o=dead\"]\n[dead_letter]\ntopic = \"dead\"\n"
    ))
    .unwrap_err();
    assert!(
        err.contains("messages.topics") && err.contains("dead_letter"),
        "{err}"
    );
    // Without [messages], START_REPLICATION asks for no messages.
    let v = validate(base).unwrap();
    assert!(v.messages.is_none());
    assert!(!crate::pg::slot::start_replication_command(&v.source(), Lsn(0)).contains("messages"));
}
