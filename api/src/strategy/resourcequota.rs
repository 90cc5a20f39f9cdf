//! ResourceQuotas: a new quota starts with the usage of its namespace as its status, and a
//! quota is not itself counted by the quotas of its namespace.

use serde_json::Value;

use crate::handler::{Api, Target};
use crate::storage::Freshness;

use super::{Hook, Strategy};

pub struct ResourceQuota;

impl Strategy for ResourceQuota {
    fn prepare_for_store<'a>(
        &'a self,
        api: &'a Api,
        t: &'a Target,
        obj: &'a mut Value,
    ) -> Hook<'a> {
        Box::pin(async move {
            let hard = obj
                .pointer("/spec/hard")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let status = api
                .quota_status(t.namespace().unwrap_or(""), &hard, Freshness::Latest)
                .await?
                .0;
            crate::value::set(obj, &["status"], status);
            Ok(())
        })
    }

    fn charged_by_quota(&self) -> bool {
        false
    }
}
