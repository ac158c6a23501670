//! The shipped example configuration must stay valid.

use std::path::Path;

#[test]
fn the_standalone_example_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/standalone/lb-agent.yaml");
    let config = lb_agent::config::Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.vips.len(), 2);
    assert_eq!(config.services.len(), 2);
    assert!(!lb_agent::service_plan::plan(&config, "node-b").local_endpoints.is_empty());
}
