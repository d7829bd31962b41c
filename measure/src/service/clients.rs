//! The clients of a level: one spawned task each, joined in client order.

use tokio::task::JoinHandle;

/// Waits for every client task of a level and returns the first error (in
/// client order) once all have ended, so that no client outlives the
/// level; a client's panic is resumed here.
pub(crate) async fn join_clients<E>(tasks: Vec<JoinHandle<Result<(), E>>>) -> Result<(), E> {
    let mut first_error = None;
    for task in tasks {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }
    first_error.map_or(Ok(()), Err)
}
