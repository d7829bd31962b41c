//! `STREAMALLOC_CONF` read from the environment: the one test that does,
//! alone in its binary. It runs itself again as a child process with the
//! variable set (so nothing here writes the environment of a running
//! process), once with a good configuration and once with a bad value.

use std::process::Command;

use streamalloc::Budget;
use streamalloc::ResourceBuilder;
use streamalloc::WaitPolicy;
use streamalloc::{AllocTag, AsyncResource, Device, ResourceError, gpu::sim::SimGpu};
use streamalloc::{BlockInfoState, memory_history_capacity};

const GOOD: &str = "budget:1MiB, debug_guard:on, history:50, wait:park";
const BAD: &str = "budget:1MiB,history:lots";

fn child(conf: &str) -> std::process::Output {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "streamalloc_conf_shapes_the_stack",
            "--nocapture",
        ])
        .env("STREAMALLOC_CONF", conf)
        .output()
        .unwrap()
}

#[tokio::test]
async fn streamalloc_conf_shapes_the_stack() {
    match std::env::var("STREAMALLOC_CONF").ok().as_deref() {
        None => {
            for conf in [GOOD, BAD] {
                let out = child(conf);
                assert!(
                    out.status.success(),
                    "{conf}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
            }
        }
        Some(GOOD) => {
            let device = Device::sim(&SimGpu::new(), 1);
            let res = AsyncResource::configured(&device).unwrap();
            let s = device.stream(0).unwrap();
            // The budget: a request past its limit fails at once.
            let err = res.allocate(2 << 20, s, AllocTag("big")).await.unwrap_err();
            assert!(matches!(err, ResourceError::BudgetExceeded { .. }), "{err}");
            assert_eq!(res.snapshot().budgets[0].limit, 1 << 20);
            // The debug guard: a freed block waits in quarantine.
            let b = res.allocate(4096, s, AllocTag("q")).await.unwrap();
            let at = b.ptr();
            drop(res.deallocate(b).unwrap());
            let snap = res.snapshot();
            let q = snap.blocks.iter().find(|b| b.address == at).unwrap();
            assert_eq!(q.state, BlockInfoState::Quarantined);
            // The history and the wait policy.
            assert_eq!(memory_history_capacity(), 50);
            assert_eq!(res.wait_policy(), WaitPolicy::PARK_AT_ONCE);
            // A stack chosen in code keeps its layers and takes the rest.
            let coded = AsyncResource::build(
                &device,
                &ResourceBuilder::new().budget(&Budget::new(1 << 30)),
            )
            .unwrap();
            assert_eq!(coded.snapshot().budgets[0].limit, 1 << 30);
            assert_eq!(coded.wait_policy(), WaitPolicy::PARK_AT_ONCE);
        }
        Some(BAD) => {
            let device = Device::sim(&SimGpu::new(), 1);
            for err in [
                AsyncResource::configured(&device).err().expect("refused"),
                AsyncResource::on(&device).expect_err("refused"),
            ] {
                match err {
                    ResourceError::Config { key, value, .. } => {
                        assert_eq!((key.as_str(), value.as_str()), ("history", "lots"))
                    }
                    other => panic!("{other}"),
                }
            }
            assert_eq!(memory_history_capacity(), 0, "nothing was applied");
        }
        Some(other) => panic!("unexpected STREAMALLOC_CONF={other}"),
    }
}
