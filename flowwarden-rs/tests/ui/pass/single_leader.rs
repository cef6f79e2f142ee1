use flowwarden::{change_stream, ChangeContext, Deployment, LeaseConfig, StreamHandler};

#[derive(Default)]
struct Leader;

#[change_stream(collection = "orders", deployment = SingleLeader, renew_secs = 5)]
impl Leader {
    #[on_insert]
    async fn inserted(&self, _ctx: &ChangeContext<bson::Document>) {}
}

fn main() {
    let def = <Leader as StreamHandler>::definition();
    assert_eq!(
        def.deployment,
        Deployment::SingleLeader(LeaseConfig { renew_secs: 5, ..LeaseConfig::DEFAULT })
    );
}
