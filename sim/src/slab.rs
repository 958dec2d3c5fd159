//! Values kept under reusable numbers: the calls in flight, the events
//! pending.

/// Values under numbers, a number reused once its value is taken.
#[derive(Debug)]
pub struct Slab<T> {
    values: Vec<Option<T>>,
    free: Vec<usize>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            values: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// Keeps `value`; returns its number.
    pub fn insert(&mut self, value: T) -> usize {
        match self.free.pop() {
            Some(index) => {
                self.values[index] = Some(value);
                index
            }
            None => {
                self.values.push(Some(value));
                self.values.len() - 1
            }
        }
    }

    /// Takes the value numbered `index` out.
    ///
    /// # Panics
    ///
    /// If no value is kept under `index`.
    pub fn take(&mut self, index: usize) -> T {
        let value = self.values[index].take().expect("a value kept");
        self.free.push(index);
        value
    }

    /// The value numbered `index`.
    ///
    /// # Panics
    ///
    /// If no value is kept under `index`.
    pub fn get_mut(&mut self, index: usize) -> &mut T {
        self.values[index].as_mut().expect("a value kept")
    }

    /// Every value kept.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.values.iter_mut().flatten()
    }
}
