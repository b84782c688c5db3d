"""Images and datasets: reading image files safely (:mod:`.images`), batched augmentation (:mod:`.augment`),
class folders and their train/val splits (:mod:`.splits`), in-memory datasets (:mod:`.datasets`) and the
images the package draws itself (:mod:`.synthetic` flowers)."""
